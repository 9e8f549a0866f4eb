package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

func newTestAftercare(t *testing.T) (*aftercare, *memory.Store) {
	store := memory.New(memory.Options{})
	t.Cleanup(func() { store.Close() })
	return &aftercare{store: store, logger: zap.NewNop(), hold: func() (func(), bool) { return func() {}, true }}, store
}

// A retry may meet the abandoned reservation a moment before the worker
// releases it; it must still be told to look again.
func TestReclaimAfterTheWorkerReleasedTheGhost(t *testing.T) {
	a, store := newTestAftercare(t)
	key := storage.Key{Scope: "s", ID: "k"}
	res, err := store.Reserve(t.Context(), key, []byte("fp"), time.Minute) // the ghost
	if err != nil {
		t.Fatal(err)
	}
	a.add(&chore{kind: choreAbandon, key: key, token: res.Token, until: time.Now().Add(time.Minute)})
	testutil.Eventually(t, 5*time.Second, "the worker to release the ghost", func() bool {
		_, err := store.Get(t.Context(), key, false)
		return err != nil
	})
	if !a.reclaim(key) {
		t.Fatal("reclaim right after the worker released the ghost: false, want true (look again)")
	}
	if a.reclaim(storage.Key{Scope: "s", ID: "other"}) {
		t.Fatal("reclaim of a key never abandoned: true")
	}
	time.Sleep(ghostSettle + 100*time.Millisecond)
	if a.reclaim(key) {
		t.Fatal("reclaim long after the abandon finished: true, want false")
	}
}

func TestReclaimReleasesAPendingGhost(t *testing.T) {
	a, store := newTestAftercare(t)
	key := storage.Key{Scope: "s", ID: "k"}
	res, err := store.Reserve(t.Context(), key, []byte("fp"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// Queued but not started: the worker is held back by a long pause.
	a.abandoned = map[storage.Key]*chore{key: {kind: choreAbandon, key: key, token: res.Token, until: time.Now().Add(time.Minute)}}
	if !a.reclaim(key) {
		t.Fatal("reclaim of a pending ghost: false")
	}
	if _, err := store.Get(t.Context(), key, false); err == nil {
		t.Fatal("the ghost is still there")
	}
}

// failingStore fails Complete and Release while down, and counts Renew
// calls, which it lets through: a store that a write cannot reach for a
// while.
type failingStore struct {
	storage.Store
	mu       sync.Mutex
	down     bool
	renewals int
}

func (s *failingStore) isDown() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.down
}

func (s *failingStore) setDown(down bool) {
	s.mu.Lock()
	s.down = down
	s.mu.Unlock()
}

func (s *failingStore) Complete(ctx context.Context, key storage.Key, token storage.Token, resp *storage.Response, ttl time.Duration) error {
	if s.isDown() {
		return errUnreachable
	}
	return s.Store.Complete(ctx, key, token, resp, ttl)
}

func (s *failingStore) Release(ctx context.Context, key storage.Key, token storage.Token) error {
	if s.isDown() {
		return errUnreachable
	}
	return s.Store.Release(ctx, key, token)
}

func (s *failingStore) Renew(ctx context.Context, key storage.Key, token storage.Token, lease time.Duration) error {
	s.mu.Lock()
	s.renewals++
	s.mu.Unlock()
	return s.Store.Renew(ctx, key, token, lease)
}

func (s *failingStore) renewed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.renewals
}

// A write that waits in aftercare keeps its request's lease: for longer
// than lock_timeout after the request ended, a retry with the same
// request gets 409 and one with another body 422, never a run, until the
// write lands. (Before, nothing renewed the lease meanwhile: it lapsed,
// and a retry on another instance ran the upstream again.)
func TestAWriteWaitingInAftercareKeepsItsLease(t *testing.T) {
	for _, write := range []string{"complete", "release"} {
		t.Run(write, func(t *testing.T) {
			h := isolated(t, &Handler{LockTimeout: caddy.Duration(time.Second)})
			store := &failingStore{Store: h.rawStore()}
			h.useStore(store)
			status := http.StatusCreated
			if write == "release" {
				status = http.StatusBadGateway // in release_on
			}
			up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
				store.setDown(true) // the store goes away while the request runs
				w.WriteHeader(status)
				return nil
			}}
			if w := serve(h, up, request("k", `{"a":1}`)); w.Code != status {
				t.Fatalf("first: %d, want %d", w.Code, status)
			}
			up.Serve = nil

			// A lease's worth of renewals after the request ended: without
			// them the lease would have lapsed by now.
			ended := store.renewed()
			testutil.Eventually(t, 20*time.Second, "a lease's worth of renewals while the write waits", func() bool {
				return store.renewed() >= ended+renewals+1
			})
			if w := serve(h, up, request("k", `{"a":1}`)); w.Code != http.StatusConflict {
				t.Fatalf("retry while the %s waits, past lock_timeout: %d, want 409", write, w.Code)
			}
			if w := serve(h, up, request("k", `{"a":2}`)); w.Code != http.StatusUnprocessableEntity {
				t.Fatalf("retry with another body while the %s waits, past lock_timeout: %d, want 422", write, w.Code)
			}

			store.setDown(false)
			var w *httptest.ResponseRecorder
			testutil.Eventually(t, 10*time.Second, "the key to leave the in-flight state once the store is back", func() bool {
				w = serve(h, up, request("k", `{"a":1}`))
				return w.Code != http.StatusConflict
			})
			switch write {
			case "complete":
				if !(w.Code == status && w.Header().Get("Idempotent-Replayed") == "true") || up.Calls.Load() != 1 {
					t.Fatalf("retry after the store came back: %d replayed=%q, upstream ran %d times; want the replay and 1",
						w.Code, w.Header().Get("Idempotent-Replayed"), up.Calls.Load())
				}
			case "release":
				if w.Code != http.StatusCreated || up.Calls.Load() != 2 {
					t.Fatalf("retry after the store came back: %d, upstream ran %d times; want a second run", w.Code, up.Calls.Load())
				}
			}
		})
	}
}

// TestAftercareBacklogCountsTheWritesNotDoneWith: the backlog gauge
// (caddy_http_idempotency_aftercare_backlog) counts a write that failed
// while it waits, and lets go of it once it lands.
func TestAftercareBacklogCountsTheWritesNotDoneWith(t *testing.T) {
	a, mem := newTestAftercare(t)
	store := &failingStore{Store: mem, down: true}
	a.store = store
	backlog := prometheus.NewGauge(prometheus.GaugeOpts{Name: "test_aftercare_backlog"})
	a.backlog = backlog
	key := storage.Key{Scope: "s", ID: "backlog"}
	res, err := mem.Reserve(t.Context(), key, []byte("fp"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	a.add(&chore{kind: choreComplete, key: key, token: res.Token, resp: &storage.Response{Status: 201}, ttl: time.Hour, until: time.Now().Add(time.Minute)})
	if got := gaugeOf(t, backlog); got != 1 {
		t.Fatalf("backlog %v with one write waiting, want 1", got)
	}
	store.setDown(false)
	testutil.Eventually(t, 10*time.Second, "the write to land and leave the backlog", func() bool {
		return gaugeOf(t, backlog) == 0
	})
	if rec, err := mem.Get(t.Context(), key, false); err != nil || rec.State != storage.Completed {
		t.Fatalf("after the backlog emptied: %v %v, want the record completed", rec, err)
	}
}

func gaugeOf(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// outageStore is a store that goes away: while down, a Reserve is written
// but its reply lost (the outcome unknown to the request, which gets 503),
// and a Complete or a Release fails.
type outageStore struct {
	storage.Store
	down atomic.Bool
}

func (s *outageStore) Reserve(ctx context.Context, key storage.Key, fp []byte, lease time.Duration) (storage.Reservation, error) {
	res, err := s.Store.Reserve(ctx, key, fp, lease)
	if err == nil && s.down.Load() {
		return storage.Reservation{Token: res.Token}, errUnreachable
	}
	return res, err
}

func (s *outageStore) Complete(ctx context.Context, key storage.Key, token storage.Token, resp *storage.Response, ttl time.Duration) error {
	if s.down.Load() {
		return errUnreachable
	}
	return s.Store.Complete(ctx, key, token, resp, ttl)
}

func (s *outageStore) Release(ctx context.Context, key storage.Key, token storage.Token) error {
	if s.down.Load() {
		return errUnreachable
	}
	return s.Store.Release(ctx, key, token)
}

// TestAftercareBacklogCountsOnlyWritesOfRequestsThatRan: during an outage
// in which one request was running and twenty got 503, the backlog
// (caddy_http_idempotency_aftercare_backlog) says 1, the one write that
// settles the record of a request that ran and holds its key in flight;
// the twenty reservations of the 503s, whose outcome is unknown, are
// counted apart (caddy_http_idempotency_abandoned_reservations). Before,
// the backlog said 21. Both empty once the store is back.
func TestAftercareBacklogCountsOnlyWritesOfRequestsThatRan(t *testing.T) {
	h := isolated(t, &Handler{})
	store := &outageStore{Store: h.rawStore()}
	h.useStore(store)
	backlog := prometheus.NewGauge(prometheus.GaugeOpts{Name: "test_aftercare_backlog"})
	abandons := prometheus.NewGauge(prometheus.GaugeOpts{Name: "test_abandoned_reservations"})
	h.keeper.aftercare.backlog, h.keeper.aftercare.abandons = backlog, abandons

	_, release, done := holdInFlight(h, request("running", `{}`))
	store.down.Store(true)
	for i := range 20 {
		if w := serve(h, &upstream{}, request(fmt.Sprintf("refused-%d", i), `{}`)); w.Code != http.StatusServiceUnavailable {
			t.Fatalf("request %d during the outage: %d, want 503", i, w.Code)
		}
	}
	release()
	if w := <-done; w.Code != http.StatusCreated {
		t.Fatalf("the running request: %d, want 201", w.Code)
	}
	if b, a := gaugeOf(t, backlog), gaugeOf(t, abandons); b != 1 || a != 20 {
		t.Fatalf("during the outage: backlog %v, abandoned reservations %v; want 1 (the completion) and 20 (the 503s)", b, a)
	}

	store.down.Store(false)
	testutil.Eventually(t, 10*time.Second, "both gauges to empty once the store is back", func() bool {
		return gaugeOf(t, backlog) == 0 && gaugeOf(t, abandons) == 0
	})
	if w := serve(h, &upstream{}, request("running", `{}`)); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of the running request after the outage: %d, want its replay", w.Code)
	}
}

// unreplicatedStore is a primary whose replicas may be cut off: while
// cut, a completion lands on it (the memory store) but falls short of
// its replicas, and so does one sent again of the record its lease
// completed already (the write a Redis or PostgreSQL store makes to learn
// whether replicas have it); once healed, that one is acknowledged.
// Renewals of a completed record answer that the lease is lost, as the
// primary would.
type unreplicatedStore struct {
	storage.Store
	mu          sync.Mutex
	cut         bool
	completedBy map[storage.Key]storage.Token
	completes   int // Complete calls
	lostRenews  int // renewals answered ErrLeaseLost
}

func (s *unreplicatedStore) setCut(cut bool) {
	s.mu.Lock()
	s.cut = cut
	s.mu.Unlock()
}

func (s *unreplicatedStore) counts() (completes, lostRenews int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.completes, s.lostRenews
}

func (s *unreplicatedStore) Complete(ctx context.Context, key storage.Key, token storage.Token, resp *storage.Response, ttl time.Duration) error {
	err := s.Store.Complete(ctx, key, token, resp, ttl)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.completes++
	switch {
	case err == nil:
		s.completedBy[key] = token
	case errors.Is(err, storage.ErrLeaseLost) && s.completedBy[key] == token:
		// Completed by this lease already: written again, and waited for.
	default:
		return err
	}
	if s.cut {
		return fmt.Errorf("%w: %w: 0 of 1 replicas", storage.ErrUnavailable, storage.ErrNotReplicated)
	}
	return err
}

func (s *unreplicatedStore) Renew(ctx context.Context, key storage.Key, token storage.Token, lease time.Duration) error {
	err := s.Store.Renew(ctx, key, token, lease)
	if errors.Is(err, storage.ErrLeaseLost) {
		s.mu.Lock()
		s.lostRenews++
		s.mu.Unlock()
	}
	return err
}

// TestACompletionShortOfItsReplicasIsSentAgainWithItsLeaseRenewed: a
// completion that the store took but too few replicas acknowledged
// (storage.ErrNotReplicated) is sent again until they do, and its lease
// is renewed all along, though the primary answers the renewals that the
// lease is lost (it completed the record): a replica promoted meanwhile
// holds the record in flight under that lease, and must not see it lapse
// before the completion reaches it. Retries meanwhile get the primary's
// replay; once the replicas have it, the chore is done with and lets the
// lease go. Before the fix, the first loss stopped the renewals (and the
// store accepted the completion, so nothing was sent again).
func TestACompletionShortOfItsReplicasIsSentAgainWithItsLeaseRenewed(t *testing.T) {
	h := isolated(t, &Handler{LockTimeout: caddy.Duration(time.Second)})
	store := &unreplicatedStore{Store: h.rawStore(), completedBy: map[storage.Key]storage.Token{}}
	h.useStore(store)
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		store.setCut(true) // the replicas are cut off while the request runs
		w.WriteHeader(http.StatusCreated)
		return nil
	}}
	if w := serve(h, up, request("k", `{"a":1}`)); w.Code != http.StatusCreated {
		t.Fatalf("first: %d, want 201", w.Code)
	}
	up.Serve = nil

	// A lease's worth of renewals answered "lost", and the completion sent
	// again meanwhile: without them the lease on a promoted replica would
	// have lapsed by now.
	testutil.Eventually(t, 20*time.Second, "a lease's worth of renewals through the primary's losses, and the completion sent again", func() bool {
		completes, lost := store.counts()
		return lost >= renewals+1 && completes >= 3
	})
	if w := serve(h, up, request("k", `{"a":1}`)); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || up.Calls.Load() != 1 {
		t.Fatalf("retry while the completion is sent again: %d replayed=%q, upstream ran %d times; want the replay and 1",
			w.Code, w.Header().Get("Idempotent-Replayed"), up.Calls.Load())
	}

	store.setCut(false)
	a := h.keeper.aftercare
	testutil.Eventually(t, 10*time.Second, "the chore done with once the replicas have the completion", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.pending) == 0 && !a.running
	})
}
