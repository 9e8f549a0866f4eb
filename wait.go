package idempotency

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/internal/knobs"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// waitFor returns how long a request that found its key in flight waits
// for the first request to finish: what it asks with `Prefer: wait=<s>`
// (RFC 7240), capped at wait_timeout, or wait_timeout with in_flight wait
// when it asks nothing; asked says whether it asked.
func (h *Handler) waitFor(r *http.Request) (wait time.Duration, asked bool) {
	maxWait := time.Duration(h.policy.waitTimeout)
	if asked, ok := preferredWait(r.Header); ok {
		return min(asked, maxWait), true
	}
	if h.policy.waitInFlight {
		return maxWait, false
	}
	return 0, false
}

// Waiting costs the store work (a poll or a subscription per waiter and
// key) and holds the waiting request's body, which it needs if the first
// request frees the key (it then runs). So a handler keeps only so many
// requests waiting at once (knobs.MaxWaiters and its neighbours), and past
// any of these bounds a request that would wait gets 409 at once and lets
// its body go:
//
//   - 1000 in all: a burst of retries must not turn into a burst of store
//     load;
//   - 250 for one client (scope), and a quarter of the bytes below: a
//     client retrying many keys at once takes a share of the places and
//     of the memory, never every client's;
//   - 64 for one key, and a quarter of the bytes below: one client's
//     retry storm takes a small share of the places and of the memory,
//     never another client's;
//   - 64 MiB of request bodies (the size of the buffers they are held
//     in), so that a storm of large bodies cannot take the instance's
//     memory. A key's first waiter may take more than the key's share,
//     and the handler's first more than all of it, so that a body larger
//     than the share can still wait.

// waitRoom is what a handler's waiting requests take: places and the
// bytes of their bodies, in all, per client (by scope hash) and per key
// (by key hash).
type waitRoom struct {
	mu       sync.Mutex
	all      waitShare
	perScope map[string]waitShare
	perKey   map[string]waitShare
}

// waitShare is what the waiting requests of a handler, or of one key,
// take.
type waitShare struct {
	places int64
	bytes  int64
}

// fits reports whether a request holding size bytes fits in s, under
// places and bytes (an empty share takes one request of any size).
func (s waitShare) fits(size, places, bytes int64) bool {
	return s.places < places && (s.places == 0 || s.bytes+size <= bytes)
}

// enter takes a place for a request of scope hash sh and key hash kh
// whose body holds size bytes, if one is free within every bound.
func (wr *waitRoom) enter(sh, kh string, size int64) bool {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	scope, key, bytes := wr.perScope[sh], wr.perKey[kh], knobs.MaxWaitingBytes.Load()
	if !wr.all.fits(size, knobs.MaxWaiters.Load(), bytes) ||
		!scope.fits(size, knobs.MaxWaitersPerScope.Load(), bytes/4) ||
		!key.fits(size, knobs.MaxWaitersPerKey.Load(), bytes/4) {
		return false
	}
	if wr.perKey == nil {
		wr.perScope, wr.perKey = make(map[string]waitShare), make(map[string]waitShare)
	}
	wr.all.places++
	wr.all.bytes += size
	wr.perScope[sh] = waitShare{places: scope.places + 1, bytes: scope.bytes + size}
	wr.perKey[kh] = waitShare{places: key.places + 1, bytes: key.bytes + size}
	return true
}

// leave gives back the place enter took.
func (wr *waitRoom) leave(sh, kh string, size int64) {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	wr.all.places--
	wr.all.bytes -= size
	leaveShare(wr.perScope, sh, size)
	leaveShare(wr.perKey, kh, size)
}

// leaveShare gives back one place of size bytes in shares[id].
func leaveShare(shares map[string]waitShare, id string, size int64) {
	if s := shares[id]; s.places > 1 {
		shares[id] = waitShare{places: s.places - 1, bytes: s.bytes - size}
	} else {
		delete(shares, id)
	}
}

// waiting is how many requests wait, for the tests.
func (wr *waitRoom) waiting() (places, bytes int64) {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	return wr.all.places, wr.all.bytes
}

// wait lets a request whose key is in flight wait for the first request
// to finish, if it may (waitFor) and a place is free (waitRoom): it
// returns what the store holds then, and how a replay is counted. A
// request that does not get its turn (409) lets its body go at once
// rather than once its answer is written: a storm of retries that a slow
// client does not read must not hold a body each.
func (x *exchange) wait(res storage.Reservation) (storage.Reservation, outcome, error) {
	h, k := x.h, x.k
	if wait, asked := h.waitFor(x.r); wait > 0 {
		// The canonical JSON is only the detail of a new record, made
		// again from the body if this request runs after all.
		k.dropCanonical()
		size := int64(k.body.Cap())
		if k.decoded != nil {
			size += int64(k.decoded.Cap()) // a coded body's content, kept beside it
		}
		if h.waiters.enter(k.key.Scope, k.hash, size) {
			if asked {
				x.w.Header().Set("Preference-Applied", preferenceApplied(wait))
			}
			res, err := h.keeper.await(x.r.Context(), k.key, k.fp, res, wait)
			h.waiters.leave(k.key.Scope, k.hash, size)
			if err != nil || res.Outcome != storage.Conflict {
				return res, outcomeWaited, err
			}
		}
	}
	k.body.Close()
	return res, outcomeReplayed, nil
}

// dropCanonical gives back the canonical JSON kept for the detail of a
// new record (DetailCanonical makes it again from the body).
func (k *keyedRequest) dropCanonical() {
	if k.canonBuf != nil {
		if cap(*k.canonBuf) <= maxPooledBody {
			canonPool.Put(k.canonBuf)
		}
		k.canonBuf, k.canonical = nil, nil
	}
}

// preferredWait reads the wait preference of the Prefer header fields:
// `wait=<delta-seconds>`, possibly quoted, with or without parameters.
func preferredWait(h http.Header) (time.Duration, bool) {
	for _, field := range h.Values("Prefer") {
		for pref := range strings.SplitSeq(field, ",") {
			pref, _, _ = strings.Cut(pref, ";")
			name, value, hasValue := strings.Cut(strings.TrimSpace(pref), "=")
			if !hasValue || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			value = strings.Trim(strings.TrimSpace(value), `"`)
			if value == "" || strings.Trim(value, "0123456789") != "" {
				return 0, false // a malformed preference is ignored
			}
			// Any number of digits: a wait longer than wait_timeout is
			// wait_timeout (waitFor caps it).
			secs, err := strconv.ParseUint(value, 10, 32)
			if err != nil {
				secs = math.MaxInt32 // out of range: as long as allowed
			}
			return time.Duration(min(secs, math.MaxInt32)) * time.Second, true
		}
	}
	return 0, false
}

// preferenceApplied is the Preference-Applied value for a wait of d.
func preferenceApplied(d time.Duration) string {
	return "wait=" + strconv.FormatInt(int64(math.Ceil(d.Seconds())), 10)
}
