package redis

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/redistest"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// TestRoundTrips counts the commands the store sends, on a private server
// (go test ./... runs packages in parallel against the shared one).
// MONITOR counts what clients send; INFO commandstats confirms that each
// of those commands ran one script (it also counts the commands scripts
// call, so it cannot count round trips by itself).
func TestRoundTrips(t *testing.T) {
	srv := redistest.StartServer(t)
	s := newTestStore(t, srv.Addr, Options{})
	mon := redistest.NewMonitor(t, srv.Addr)
	ctx := t.Context()

	// Warm up: the connection's handshake, and the first EVALSHA of each
	// script, which a fresh server answers with NOSCRIPT (then EVAL).
	warm := storage.Key{Scope: "scope", ID: "warm-up"}
	tok := acquire(t, s, warm, time.Minute)
	s.Renew(ctx, warm, tok, time.Minute)
	s.Complete(ctx, warm, tok, textResponse("warm"), time.Minute)
	s.Reserve(ctx, warm, fp, time.Minute)
	s.Get(ctx, warm, true)
	s.Delete(ctx, warm)
	s.Release(ctx, warm, acquire(t, s, warm, time.Minute))

	key := storage.Key{Scope: "scope", ID: "counted"}
	var tok2 storage.Token
	steps := []struct {
		name string
		want int
		fn   func() error
	}{
		{"new key (Reserve + Complete)", 2, func() error {
			res, err := s.Reserve(ctx, key, fp, time.Minute)
			if err != nil || res.Outcome != storage.Acquired {
				return fmt.Errorf("Reserve: %v %v", res.Outcome, err)
			}
			return s.Complete(ctx, key, res.Token, textResponse("counted"), time.Minute)
		}},
		{"replay (Reserve)", 1, func() error {
			res, err := s.Reserve(ctx, key, fp, time.Minute)
			if err != nil || res.Outcome != storage.Replay {
				return fmt.Errorf("Reserve: %v %v", res.Outcome, err)
			}
			return nil
		}},
		{"mismatch (Reserve)", 1, func() error {
			res, err := s.Reserve(ctx, key, []byte("other"), time.Minute)
			if err != nil || res.Outcome != storage.Mismatch {
				return fmt.Errorf("Reserve: %v %v", res.Outcome, err)
			}
			return nil
		}},
		{"Get", 1, func() error { _, err := s.Get(ctx, key, true); return err }},
		{"Delete", 1, func() error { return s.Delete(ctx, key) }},
		{"Reserve new", 1, func() error {
			res, err := s.Reserve(ctx, key, fp, time.Minute)
			tok2 = res.Token
			return err
		}},
		{"conflict (Reserve)", 1, func() error {
			res, err := s.Reserve(ctx, key, fp, time.Minute)
			if err != nil || res.Outcome != storage.Conflict {
				return fmt.Errorf("Reserve: %v %v", res.Outcome, err)
			}
			return nil
		}},
		{"Renew", 1, func() error { return s.Renew(ctx, key, tok2, time.Minute) }},
		{"Release", 1, func() error { return s.Release(ctx, key, tok2) }},
	}
	for _, step := range steps {
		before := mon.CommandStats()
		var err error
		cmds := mon.Commands(func() { err = step.fn() })
		after := mon.CommandStats()
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if len(cmds) != step.want {
			t.Errorf("%s: %d commands sent (%s), want %d", step.name, len(cmds), names(cmds), step.want)
		}
		for _, c := range cmds {
			if c.Name != "evalsha" {
				t.Errorf("%s: sent %s, want only EVALSHA", step.name, c.Name)
			}
		}
		if d := after["evalsha"] - before["evalsha"]; d != step.want {
			t.Errorf("%s: commandstats evalsha +%d, want +%d", step.name, d, step.want)
		}
		t.Logf("%s: %d round trip(s): %s", step.name, len(cmds), names(cmds))
	}
}

// names renders commands and the commands their scripts called.
func names(cmds []redistest.Command) string {
	parts := make([]string, len(cmds))
	for i, c := range cmds {
		parts[i] = c.Name
		if len(c.Script) > 0 {
			parts[i] += "[" + strings.Join(c.Script, " ") + "]"
		}
	}
	return strings.Join(parts, ", ")
}
