package memory

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// TestStressOwnership hammers a few keys with every operation from many
// goroutines, with leases short enough to lapse mid-run, a janitor sweeping
// all the time, a MaxKeys below the key count and per-scope shares that
// bind, and checks that the counts of records and bytes stay exact and that no key
// ever had two owners: completed records never expire here and nothing is
// deleted, so at most one token per key may ever complete it, and every
// replay must show that token's response for the replaying fingerprint.
func TestStressOwnership(t *testing.T) {
	const (
		workers = 32
		ops     = 2000
		nkeys   = 50
		maxKeys = 40
	)
	s := New(Options{MaxKeys: maxKeys, JanitorInterval: time.Millisecond})
	defer s.Close()
	ctx := t.Context()
	fps := [][]byte{[]byte("fp0"), []byte("fp1")}

	var (
		mu        sync.Mutex
		completed = map[int][]storage.Token{} // successful Completes per key
		replayed  = map[int]map[storage.Token]bool{}
	)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			// Leases this worker acquired per key, stale ones included, so
			// that stale tokens get tried too.
			held := map[int][]lease{}
			pick := func(k int) lease {
				if ls := held[k]; len(ls) > 0 {
					return ls[r.IntN(len(ls))]
				}
				return lease{token: storage.NewToken()}
			}
			for range ops {
				k := r.IntN(nkeys)
				// A few scopes, so that their shares bind as well.
				key := storage.Key{Scope: "stress-" + strconv.Itoa(k%4), ID: strconv.Itoa(k)}
				switch op := r.IntN(100); {
				case op < 35:
					f := r.IntN(len(fps))
					res, err := s.Reserve(ctx, key, fps[f], time.Duration(1+r.IntN(10))*time.Millisecond)
					switch {
					case errors.Is(err, storage.ErrFull), errors.Is(err, storage.ErrScopeFull):
					case err != nil:
						t.Errorf("Reserve: %v", err)
					case res.Outcome == storage.Acquired:
						held[k] = append(held[k], lease{res.Token, f})
					case res.Outcome == storage.Replay:
						var tok storage.Token
						var gotF int
						fmt.Sscanf(string(res.Record.Response.Body), "%d/%d", &tok, &gotF)
						if gotF != f {
							t.Errorf("key %d: fingerprint %d replayed the response of %d", k, f, gotF)
						}
						mu.Lock()
						if replayed[k] == nil {
							replayed[k] = map[storage.Token]bool{}
						}
						replayed[k][tok] = true
						mu.Unlock()
					}
				case op < 50:
					l := pick(k)
					// The response says who wrote it, for which fingerprint.
					resp := &storage.Response{Status: 200, Body: fmt.Appendf(nil, "%d/%d", l.token, l.fp)}
					if s.Complete(ctx, key, l.token, resp, time.Hour) == nil {
						mu.Lock()
						completed[k] = append(completed[k], l.token)
						mu.Unlock()
					}
				case op < 65:
					s.Release(ctx, key, pick(k).token)
				case op < 80:
					s.Renew(ctx, key, pick(k).token, time.Duration(1+r.IntN(10))*time.Millisecond)
				case op < 95:
					rec, err := s.Get(ctx, key, r.IntN(2) == 0)
					if err == nil && (rec.State == storage.InFlight) != (rec.Token != 0) {
						t.Errorf("key %d: Get = state %v token %d", k, rec.State, rec.Token)
					}
					if n := s.Len(); n > maxKeys {
						t.Errorf("Len %d beyond MaxKeys %d", n, maxKeys)
					}
				default:
					s.Wait(ctx, key, time.Millisecond)
				}
			}
		})
	}
	wg.Wait()

	for k, toks := range completed {
		if len(toks) > 1 {
			t.Errorf("key %d completed by %d tokens: %v", k, len(toks), toks)
		}
	}
	for k, toks := range replayed {
		for tok := range toks {
			if len(completed[k]) == 0 || completed[k][0] != tok {
				t.Errorf("key %d replayed token %d, completed by %v", k, tok, completed[k])
			}
		}
	}
	if len(completed) == 0 || len(replayed) == 0 {
		t.Errorf("stress too weak: %d keys completed, %d replayed", len(completed), len(replayed))
	}
	checkCount(t, s)
}

// lease is a token a stress worker acquired and the fingerprint it used.
type lease struct {
	token storage.Token
	fp    int
}
