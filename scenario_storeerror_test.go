package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// flakyStore makes a real store fail on demand, as an unreachable backend
// would.
type flakyStore struct {
	storage.Store
	down atomic.Bool
	fail error // what it fails with; errUnreachable when nil
}

func (f *flakyStore) err() error {
	if f.fail != nil {
		return f.fail
	}
	return errUnreachable
}

// errUnreachable is how a store that cannot be reached fails: classified
// as unavailable (storage.Unavailable), the only failure fail_open passes
// by.
var errUnreachable = fmt.Errorf("%w: dial tcp 127.0.0.1:6379: connect: connection refused", storage.ErrUnavailable)

func (f *flakyStore) Reserve(ctx context.Context, key storage.Key, fp []byte, lease time.Duration) (storage.Reservation, error) {
	if f.down.Load() {
		return storage.Reservation{}, f.err()
	}
	return f.Store.Reserve(ctx, key, fp, lease)
}

func (f *flakyStore) Release(ctx context.Context, key storage.Key, token storage.Token) error {
	if f.down.Load() {
		return f.err()
	}
	return f.Store.Release(ctx, key, token)
}

func (f *flakyStore) Complete(ctx context.Context, key storage.Key, token storage.Token, resp *storage.Response, ttl time.Duration) error {
	if f.down.Load() {
		return f.err()
	}
	return f.Store.Complete(ctx, key, token, resp, ttl)
}

func withFlakyStore(h *Handler) *flakyStore {
	f := &flakyStore{Store: h.rawStore()}
	h.useStore(f)
	return f
}

func TestStoreDownFailClosedAnswers503WithoutRunning(t *testing.T) {
	h := isolated(t, &Handler{})
	store := withFlakyStore(h)
	store.down.Store(true)
	up := &upstream{}
	w := serve(h, up, request("k", "{}"))
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", w.Code)
	}
	if p := problemOf(t, w); p.Type != "urn:caddy-idempotency:store-unavailable" {
		t.Fatalf("problem %+v", p)
	}
	if up.Calls.Load() != 0 {
		t.Fatal("fail_closed ran the upstream")
	}

	store.down.Store(false) // the store is back: no restart needed
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusCreated {
		t.Fatalf("after recovery: %d", w.Code)
	}
	if w := serve(h, up, request("k", "{}")); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatal("after recovery: no replay")
	}
}

func TestStoreDownFailOpenPassesThrough(t *testing.T) {
	h := isolated(t, &Handler{OnStorageError: "fail_open"})
	store := withFlakyStore(h)
	store.down.Store(true)
	up := &upstream{}
	passed := counterValue(serverMetricsNamed(unknownServer).failOpen)
	for range 2 {
		r := request("k", `{"a":1}`)
		_, repl := servePlaceholders(h, up, r)
		if o, _ := repl.GetString(placeholderOutcome); o != string(outcomeStoreError) {
			t.Fatalf("outcome %q", o)
		}
	}
	if up.Calls.Load() != 2 {
		t.Fatalf("fail_open: upstream ran %d times, want 2", up.Calls.Load())
	}
	if got := counterValue(serverMetricsNamed(unknownServer).failOpen) - passed; got != 2 {
		t.Fatalf("fail_open_total grew by %v, want 2", got)
	}
}

func TestStoreErrorsThatProveTheStoreAnsweredFailClosedEvenWithFailOpen(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("postgres reserve: %w: state 7", storage.ErrCorrupt),
		fmt.Errorf("%w: status 42 is not a final status", storage.ErrInvalid),
		errors.New("ERROR: permission denied for table idempotency_keys (SQLSTATE 42501)"),
	} {
		h := isolated(t, &Handler{OnStorageError: "fail_open"})
		store := withFlakyStore(h)
		store.fail = err
		store.down.Store(true)
		up := &upstream{}
		w := serve(h, up, request("k", "{}"))
		if w.Code != http.StatusServiceUnavailable || up.Calls.Load() != 0 {
			t.Errorf("%v under fail_open: %d, upstream ran %d times; want 503 and never", err, w.Code, up.Calls.Load())
		}
	}
}

// TestStoreDownAtProvisionFollowsOnStorageError provisions handlers on a
// server where nothing listens: Provision must succeed (an outage must not
// block a Caddy start or reload), and requests follow on_storage_error
// within the store's 500ms timeout.
func TestStoreDownAtProvisionFollowsOnStorageError(t *testing.T) {
	sharedBackends(t).runUnreachable(func(t *testing.T, storage json.RawMessage) {
		for _, policy := range []string{failClosed, failOpen} {
			t.Run(policy, func(t *testing.T) {
				h := provision(t, &Handler{OnStorageError: policy, StorageRaw: storage})
				up := &upstream{}
				began := time.Now()
				w := serve(h, up, request("k", "{}"))
				took := time.Since(began)
				switch policy {
				case failClosed:
					if w.Code != http.StatusServiceUnavailable || up.Calls.Load() != 0 {
						t.Fatalf("fail_closed: %d, upstream ran %d times; want 503 and 0", w.Code, up.Calls.Load())
					}
					if p := problemOf(t, w); p.Type != "urn:caddy-idempotency:store-unavailable" {
						t.Fatalf("problem %+v", p)
					}
					if w.Header().Get("Retry-After") == "" {
						t.Error("503 without Retry-After")
					}
				case failOpen:
					if w.Code != http.StatusCreated || up.Calls.Load() != 1 {
						t.Fatalf("fail_open: %d, upstream ran %d times; want 201 and 1", w.Code, up.Calls.Load())
					}
				}
				if took > 2*time.Second {
					t.Errorf("answered after %v; timeout is 500ms", took)
				}
			})
		}
	})
}

func TestStoreFullAnswers503AndKeepsLiveKeys(t *testing.T) {
	// One client's share is the whole store: full, not past a share.
	h := provision(t, &Handler{StorageRaw: []byte(`{"backend":"memory","max_keys":2,"max_keys_per_scope":2}`)})
	up := &upstream{}
	serve(h, up, request("a", "{}"))
	serve(h, up, request("b", "{}"))
	w := serve(h, up, request("c", "{}"))
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("third key: %d, want 503", w.Code)
	}
	if p := problemOf(t, w); p.Type != "urn:caddy-idempotency:store-full" {
		t.Fatalf("problem %+v", p)
	}
	for _, k := range []string{"a", "b"} {
		if w := serve(h, up, request(k, "{}")); w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("live key %s was evicted", k)
		}
	}
}

func TestCompletionFailureIsFinishedWhenTheStoreRecovers(t *testing.T) {
	h := isolated(t, &Handler{})
	store := withFlakyStore(h)
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		store.down.Store(true) // the store goes away while the request runs
		w.WriteHeader(http.StatusCreated)
		return nil
	}}
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusCreated {
		t.Fatalf("first: %d", w.Code)
	}
	store.down.Store(false)
	// The completion is retried in the background: the retry soon replays
	// instead of meeting a 409 for the rest of the lease.
	var w *httptest.ResponseRecorder
	testutil.Eventually(t, 5*time.Second, "a retry after the store recovered to get the replay", func() bool {
		w = serve(h, up, request("k", "{}"))
		return w.Header().Get("Idempotent-Replayed") == "true"
	})
	if w.Code != http.StatusCreated || up.Calls.Load() != 1 {
		t.Fatalf("replay %d, upstream ran %d times; want 201 and 1", w.Code, up.Calls.Load())
	}
}

func TestReleaseFailureIsFinishedWhenTheStoreRecovers(t *testing.T) {
	h := isolated(t, &Handler{})
	store := withFlakyStore(h)
	up := &upstream{Serve: func(w http.ResponseWriter, r *http.Request) error {
		store.down.Store(true)
		w.WriteHeader(http.StatusBadGateway) // frees the key
		return nil
	}}
	serve(h, up, request("k", "{}"))
	store.down.Store(false)
	up.Serve = nil
	var w *httptest.ResponseRecorder
	testutil.Eventually(t, 5*time.Second, "the key to leave the in-flight state after the store recovered", func() bool {
		w = serve(h, up, request("k", "{}"))
		return w.Code != http.StatusConflict
	})
	if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" || up.Calls.Load() != 2 {
		t.Fatalf("retry: %d replayed=%q, upstream ran %d times; want a second run", w.Code, w.Header().Get("Idempotent-Replayed"), up.Calls.Load())
	}
}

// lostReplyStore reserves for real but reports a failure, as a store
// whose reply was lost (a timeout after the server acted) does.
type lostReplyStore struct {
	storage.Store
	lose atomic.Bool
}

func (s *lostReplyStore) Reserve(ctx context.Context, key storage.Key, fp []byte, lease time.Duration) (storage.Reservation, error) {
	res, err := s.Store.Reserve(ctx, key, fp, lease)
	if err == nil && s.lose.Load() {
		return storage.Reservation{Token: res.Token}, context.DeadlineExceeded
	}
	return res, err
}

// Release fails while replies are lost: the store is still away.
func (s *lostReplyStore) Release(ctx context.Context, key storage.Key, token storage.Token) error {
	if s.lose.Load() {
		return context.DeadlineExceeded
	}
	return s.Store.Release(ctx, key, token)
}

func TestReservationWithALostReplyIsReleased(t *testing.T) {
	h := isolated(t, &Handler{})
	store := &lostReplyStore{Store: h.rawStore()}
	h.useStore(store)
	store.lose.Store(true)
	up := &upstream{}
	if w := serve(h, up, request("k", "{}")); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("first: %d, want 503", w.Code)
	}
	store.lose.Store(false)
	// The retry meets the ghost and releases it on the spot.
	w := serve(h, up, request("k", "{}"))
	if w.Code != http.StatusCreated || up.Calls.Load() != 1 {
		t.Fatalf("retry: %d, upstream ran %d times; want 201 and 1", w.Code, up.Calls.Load())
	}
}

// A retry that lands on another instance does not know of the abandoned
// reservation: the first instance's background worker removes it.
func TestAbandonedReservationIsReleasedInTheBackground(t *testing.T) {
	shared := json.RawMessage(`{"backend":"memory","max_keys":` + strconv.FormatInt(900_000_000+nextMaxKeys.Add(1), 10) + `}`)
	a := provision(t, &Handler{StorageRaw: shared})
	b := provision(t, &Handler{StorageRaw: shared})
	store := &lostReplyStore{Store: a.rawStore()}
	a.useStore(store)
	store.lose.Store(true)
	up := &upstream{}
	if w := serve(a, up, request("k", "{}")); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("first: %d, want 503", w.Code)
	}
	if w := serve(b, up, request("k", "{}")); w.Code != http.StatusConflict {
		t.Fatalf("retry on the other instance at once: %d, want 409 (the ghost is there)", w.Code)
	}
	store.lose.Store(false)
	var w *httptest.ResponseRecorder
	testutil.Eventually(t, 5*time.Second, "the abandoned reservation to be released", func() bool {
		w = serve(b, up, request("k", "{}"))
		return w.Code != http.StatusConflict
	})
	if w.Code != http.StatusCreated || up.Calls.Load() != 1 {
		t.Fatalf("retry: %d, upstream ran %d times; want 201 and 1", w.Code, up.Calls.Load())
	}
}
