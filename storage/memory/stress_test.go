package memory

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
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

// TestStressRefusalsGiveWay hammers a full store whose scopes bind, from
// many goroutines, with new keys completed as refusals (404, 409, 422)
// and as answers that did something (200, 201, 500), releases, renewals,
// deletions of refusal records and sweeps. Records of other statuses are
// never deleted and never expire here, so each must still replay at the
// end: none gave way. The counts and the refusal lists must match the
// records held.
func TestStressRefusalsGiveWay(t *testing.T) {
	const (
		workers = 16
		ops     = 3000
		scopes  = 12
		maxKeys = 4000
	)
	s := New(Options{MaxKeys: maxKeys, MaxKeysPerScope: maxKeys / 10, JanitorInterval: time.Millisecond})
	defer s.Close()
	ctx := t.Context()
	// Mostly refusals: the records of other statuses, which never go,
	// must not fill the store before the end.
	statuses := []int{404, 404, 404, 409, 409, 409, 422, 422, 422, 422, 422, 422, 422, 422, 422, 422, 200, 201, 500}
	fp := []byte("fp")

	var mu sync.Mutex
	kept := map[storage.Key]int{} // records that did something, and their status
	var refusedKeys atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			var refused []storage.Key
			for i := range ops {
				// Some scopes busier than others, so that shares bind.
				key := storage.Key{Scope: "stress-" + strconv.Itoa(r.IntN(1+r.IntN(scopes))), ID: fmt.Sprint(w, "-", i)}
				res, err := s.Reserve(ctx, key, fp, time.Duration(1+r.IntN(20))*time.Millisecond)
				switch {
				case errors.Is(err, storage.ErrFull), errors.Is(err, storage.ErrScopeFull):
					refusedKeys.Add(1)
					continue
				case err != nil || res.Outcome != storage.Acquired:
					t.Errorf("Reserve of a new key: %v, %v", res.Outcome, err)
					return
				}
				switch op := r.IntN(10); {
				case op < 6:
					st := statuses[r.IntN(len(statuses))]
					if s.Complete(ctx, key, res.Token, &storage.Response{Status: st, Body: []byte(key.ID)}, time.Hour) != nil {
						continue // the lease lapsed and was swept
					}
					if refusal(st) {
						refused = append(refused, key)
					} else {
						mu.Lock()
						kept[key] = st
						mu.Unlock()
					}
				case op < 8:
					s.Renew(ctx, key, res.Token, time.Duration(1+r.IntN(20))*time.Millisecond)
				case op < 9:
					s.Release(ctx, key, res.Token)
				default:
					if len(refused) > 0 {
						s.Delete(ctx, refused[r.IntN(len(refused))])
					}
				}
			}
		})
	}
	wg.Wait()
	for key, st := range kept {
		res, err := s.Reserve(ctx, key, fp, time.Minute)
		if err != nil || res.Outcome != storage.Replay || res.Record.Response.Status != st {
			t.Fatalf("a record of %d: %v, %v; want its replay (it never gives way)", st, res.Outcome, err)
		}
	}
	if len(kept) == 0 || s.EvictedRefusals() == 0 {
		t.Errorf("stress too weak: %d records of other statuses kept, %d refusal records evicted", len(kept), s.EvictedRefusals())
	}
	t.Logf("%d records of other statuses kept, %d refusal records evicted, %d held, %d new keys refused", len(kept), s.EvictedRefusals(), s.Len(), refusedKeys.Load())
	s.Close() // the janitor stops: the store is idle
	checkCount(t, s)
}
