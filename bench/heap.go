package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/memory"
)

// memoryStoreReport fills a memory store with n completed records, each a
// 1 KiB response with the headers and detail the handler keeps, and
// reports the heap each record costs and what garbage collection costs
// with them live: the stop-the-world pauses and the duration of a full
// collection.
func memoryStoreReport(n int) string {
	ctx := context.Background()
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	// Room for every record: the measurement is of the records, not of
	// the store's bounds.
	store := memory.New(memory.Options{MaxKeys: n, MaxBytes: int64(n) << 12, MaxKeysPerScope: -1})
	defer store.Close()
	body := []byte(strings.Repeat("x", 1024))
	header := map[string][]string{"Content-Type": {"application/json"}, "Location": {"/orders/ord_1f8a3c"}}
	detail := make([]byte, 140) // about what fingerprint.Detail keeps for a small JSON body
	fp := make([]byte, 32)
	for i := range n {
		key := storage.Key{Scope: "3f1c2a9b7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a", ID: "key-" + strconv.Itoa(i)}
		fp[0], fp[1], fp[2] = byte(i), byte(i>>8), byte(i>>16)
		res, err := store.Reserve(ctx, key, fp, time.Minute)
		if err != nil || res.Outcome != storage.Acquired {
			return fmt.Sprintf("memory store: reserve %d: %v %v\n", i, res.Outcome, err)
		}
		resp := &storage.Response{Status: 201, Header: header, Body: body, Detail: detail}
		if err := store.Complete(ctx, key, res.Token, resp, time.Hour); err != nil {
			return fmt.Sprintf("memory store: complete %d: %v\n", i, err)
		}
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	perRecord := float64(after.HeapAlloc-before.HeapAlloc) / float64(n)

	// Full collections with the records live: their duration, and the
	// longest stop-the-world pause among them.
	gcs := 5
	start := time.Now()
	numGC := after.NumGC
	for range gcs {
		runtime.GC()
	}
	full := time.Since(start) / time.Duration(gcs)
	var st debug.GCStats
	st.PauseQuantiles = make([]time.Duration, 5)
	debug.ReadGCStats(&st)
	var final runtime.MemStats
	runtime.ReadMemStats(&final)
	var maxPause time.Duration
	for i := numGC; i < final.NumGC; i++ {
		maxPause = max(maxPause, time.Duration(final.PauseNs[(i+255)%256]))
	}
	runtime.KeepAlive(store)
	return fmt.Sprintf("Memory store, %d completed records of a 1 KiB response: %.0f bytes of heap per record (%.0f MiB in all; target <= %d: %s); "+
		"a full garbage collection with them live takes %s, of which the longest stop-the-world pause is %s (target <= %s: %s).\n",
		n, perRecord, float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), maxBytesPerRecord, verdict(perRecord <= maxBytesPerRecord),
		full.Round(time.Millisecond), maxPause.Round(time.Microsecond), maxGCPause, verdict(maxPause <= maxGCPause))
}

// The memory store's targets, set after measuring: a completed record of a
// 1 KiB response costs its bytes plus about half a KiB (headers, detail,
// index), and a million of them never stop the world for a millisecond.
const (
	maxBytesPerRecord = 1638 // 1.6 KiB
	maxGCPause        = time.Millisecond
)

func verdict(met bool) string {
	if met {
		return "met"
	}
	return "MISSED"
}
