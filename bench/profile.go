package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// startProfile fetches a CPU profile of Caddy from its admin API
// (/debug/pprof/profile) while a run lasts, into dir/<case>.pprof, and
// returns a function that waits for it. Read it with
// `go tool pprof -top bin/caddy dir/<case>.pprof`.
func startProfile(dir, admin, name string, d time.Duration) func() error {
	seconds := max(1, int(d.Seconds())-1) // end inside the run
	done := make(chan error, 1)
	go func() {
		done <- fetchProfile(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, seconds),
			filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".pprof"))
	}()
	return func() error { return <-done }
}

func fetchProfile(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile: %s answered %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
