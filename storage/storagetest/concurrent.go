package storagetest

import (
	"bytes"
	"fmt"
	"sync"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// racers is how many goroutines race for one key: enough to make a
// check-then-insert store fail reliably.
const racers = 64

// raceRounds repeats each race on a fresh key; one round may by luck not
// interleave.
const raceRounds = 8

// race runs fn(i) for i in [0, n) on n goroutines released together, and
// returns their reservations and errors.
func race(n int, fn func(i int) (storage.Reservation, error)) ([]storage.Reservation, []error) {
	res := make([]storage.Reservation, n)
	errs := make([]error, n)
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	ready.Add(n)
	done.Add(n)
	for i := range n {
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			res[i], errs[i] = fn(i)
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	return res, errs
}

func testConcurrentReserveHasOneWinner(f *fixture) {
	for round := range raceRounds {
		for _, mixed := range []bool{false, true} {
			key := f.key()
			// With mixed, odd racers send another request under the same key.
			fps := make([][]byte, racers)
			for i := range fps {
				fps[i] = fpA
				if mixed && i%2 == 1 {
					fps[i] = fpB
				}
			}
			res, errs := race(racers, func(i int) (storage.Reservation, error) {
				return f.store.Reserve(f.ctx, key, fps[i], longLease)
			})
			winner := -1
			for i, r := range res {
				if errs[i] != nil {
					f.t.Fatalf("round %d mixed=%v: racer %d: %v", round, mixed, i, errs[i])
				}
				if msg := checkReservation(r); msg != "" {
					f.t.Fatalf("round %d mixed=%v: racer %d: %s", round, mixed, i, msg)
				}
				if r.Outcome == storage.Acquired {
					if winner >= 0 {
						f.t.Fatalf("round %d mixed=%v: racers %d and %d both acquired", round, mixed, winner, i)
					}
					winner = i
				}
			}
			if winner < 0 {
				f.t.Fatalf("round %d mixed=%v: nobody acquired", round, mixed)
			}
			for i, r := range res {
				if i == winner {
					continue
				}
				want := storage.Conflict
				if !bytes.Equal(fps[i], fps[winner]) {
					want = storage.Mismatch
				}
				if r.Outcome != want {
					f.t.Fatalf("round %d mixed=%v: racer %d got %v, want %v (winner %d)", round, mixed, i, r.Outcome, want, winner)
				}
			}
		}
	}
}

func testConcurrentReserveDistinctKeys(f *fixture) {
	const n = 256
	keys := make([]storage.Key, n)
	for i := range keys {
		keys[i] = f.key()
	}
	res, errs := race(n, func(i int) (storage.Reservation, error) {
		return f.store.Reserve(f.ctx, keys[i], fpA, longLease)
	})
	for i, r := range res {
		if errs[i] != nil {
			f.t.Fatalf("key %d: %v", i, errs[i])
		}
		if r.Outcome != storage.Acquired || r.Token == 0 {
			f.t.Fatalf("key %d: %v with token %d, want acquired", i, r.Outcome, r.Token)
		}
	}
	// Each key holds its own lease.
	_, errs = race(n, func(i int) (storage.Reservation, error) {
		return storage.Reservation{}, f.store.Complete(f.ctx, keys[i], res[i].Token, textResponse(fmt.Sprint(i)), longTTL)
	})
	for i, err := range errs {
		f.wantErr(fmt.Sprintf("Complete key %d", i), err, nil)
	}
	for i, key := range keys {
		f.replays(key, fpA, textResponse(fmt.Sprint(i)))
	}
}
