// Package storagetest is the conformance suite every storage.Store must
// pass, whatever keeps the records: process memory, Redis or PostgreSQL.
//
// The suite is written for shared servers. Every subtest works on keys of
// its own random scope, so runs never collide with each other, with other
// packages testing against the same server, or with leftovers of earlier
// runs; it never assumes the store is empty and never wipes it. Timing
// allows for millisecond TTL resolution, a server clock on the same
// machine and a busy machine that stalls for a second or more: what must
// expire is slept through with room to spare (a sleep only ever lasts
// longer), what must not expire yet gets seconds of margin, events are
// waited for with bounds far beyond any stall, and times read back are
// checked to within three seconds.
package storagetest

import (
	"testing"
	"time"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// Durations used by the suite. Short ones must really expire during a test;
// long ones must not.
const (
	shortLease = 200 * time.Millisecond
	// lapse is slept to let shortLease pass, with room for millisecond
	// resolution, scheduling delays and -race.
	lapse = 900 * time.Millisecond

	longLease = time.Minute
	longTTL   = time.Hour

	// clockSlack is the tolerance on times a store reports, which a remote
	// backend takes from its own clock.
	clockSlack = 3 * time.Second
)

type subtest struct {
	name string
	fn   func(f *fixture)
}

// suite lists the behaviours every store must show, named for them.
var suite = []subtest{
	{"ReserveNewKeyAcquires", testReserveNewKeyAcquires},
	{"ReserveSameFingerprintWhileInFlightConflicts", testReserveSameFingerprintWhileInFlightConflicts},
	{"ReserveOtherFingerprintMismatches", testReserveOtherFingerprintMismatches},
	{"MismatchCarriesTheDetail", testMismatchCarriesTheDetail},
	{"FindByHash", testFindByHash},
	{"ListInFlight", testListInFlight},
	{"ReplayReturnsRecordedResponse", testReplayReturnsRecordedResponse},
	{"EmptyBodyReplays", testEmptyBodyReplays},
	{"BodyOmittedIsKept", testBodyOmittedIsKept},
	{"OutcomeUnknownIsKept", testOutcomeUnknownIsKept},
	{"OutcomeUnknownIsListedAndReleased", testOutcomeUnknownIsListedAndReleased},
	{"ConcurrentReserveHasOneWinner", testConcurrentReserveHasOneWinner},
	{"ConcurrentReserveDistinctKeys", testConcurrentReserveDistinctKeys},
	{"CompletedRecordIsImmutable", testCompletedRecordIsImmutable},
	{"ReleaseFreesKey", testReleaseFreesKey},
	{"CompletedRecordExpires", testCompletedRecordExpires},
	{"LapsedLeaseIsTakenOver", testLapsedLeaseIsTakenOver},
	{"StaleTokenCannotCompleteOrRelease", testStaleTokenCannotCompleteOrRelease},
	{"RenewKeepsLease", testRenewKeepsLease},
	{"RenewAfterLapseWithoutTakeoverSucceeds", testRenewAfterLapseWithoutTakeoverSucceeds},
	{"UnknownKeyOperations", testUnknownKeyOperations},
	{"GetReturnsRecord", testGetReturnsRecord},
	{"DeleteRemovesRecord", testDeleteRemovesRecord},
	{"ScopesAreIsolated", testScopesAreIsolated},
	{"KeysWithOddBytes", testKeysWithOddBytes},
	{"ContextCancelled", testContextCancelled},
	{"CompleteRefusesAResponseNoRecordMayHold", testCompleteRefusesAResponseNoRecordMayHold},
	{"HugeLeasesAndTTLsSaturate", testHugeLeasesAndTTLsSaturate},
}

// Run runs the conformance suite against store. The subtests run in
// parallel (most of their time is spent sleeping through leases and TTLs)
// inside one group, so Run returns only when all of them are done and the
// caller may close store right after. The storage.BatchRenewer contract
// (renewbatch.go) runs only when store implements it, and the
// storage.Waiter contract (waiter.go) only when store implements
// storage.Waiter; see WaitProbe for what makes those tests exact.
func Run(t *testing.T, store storage.Store) {
	t.Run("Conformance", func(t *testing.T) {
		for _, st := range suite {
			t.Run(st.name, func(t *testing.T) {
				t.Parallel()
				st.fn(newFixture(t, store))
			})
		}
		if b, ok := store.(storage.BatchRenewer); ok {
			for _, st := range batchRenewerSuite {
				t.Run(st.name, func(t *testing.T) {
					t.Parallel()
					st.fn(newFixture(t, store), b)
				})
			}
		}
		w, ok := store.(storage.Waiter)
		if !ok {
			return
		}
		for _, st := range waiterSuite {
			t.Run(st.name, func(t *testing.T) {
				t.Parallel()
				st.fn(newFixture(t, store), w)
			})
		}
	})
}
