package redistest

import (
	"strings"
	"testing"
)

func TestSharedServerFromTheEnvironment(t *testing.T) {
	tests := []struct {
		name, url, addr string
		want            string // the address, or a part of the error
	}{
		{name: "default", want: DefaultAddr},
		{name: "older spelling", addr: "10.0.0.1:6380", want: "10.0.0.1:6380"},
		{name: "url", url: "redis://127.0.0.1:41234/0", want: "127.0.0.1:41234"},
		{name: "url wins", url: "redis://127.0.0.1:41234", addr: "10.0.0.1:6380", want: "127.0.0.1:41234"},
		{name: "default port", url: "redis://cache/", want: "cache:6379"},
		{name: "ipv6", url: "redis://[::1]:7000/0", want: "[::1]:7000"},
		{name: "credentials", url: "redis://u:hunter2@cache:6379/0", want: "without credentials"},
		{name: "tls", url: "rediss://cache:6379/0", want: "not rediss://"},
		{name: "other database", url: "redis://cache:6379/3", want: `database 0, not "3"`},
		{name: "options", url: "redis://cache:6379/0?protocol=3", want: "without credentials or options"},
		{name: "not a url", url: "redis://u:hunter2@ca che/0", want: "is not a URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(URLEnv, tt.url)
			t.Setenv(AddrEnv, tt.addr)
			addr, err := lookupAddr()
			switch {
			case err != nil && strings.Contains(err.Error(), "hunter2"):
				t.Errorf("the error shows the password: %v", err)
			case err != nil && !strings.Contains(err.Error(), tt.want):
				t.Errorf("error %q, want one saying %q", err, tt.want)
			case err == nil && addr != tt.want:
				t.Errorf("address %q, want %q", addr, tt.want)
			}
			if got := Addr(); (err == nil) != (got != "") {
				t.Errorf("Addr() = %q with error %v", got, err)
			}
		})
	}
}
