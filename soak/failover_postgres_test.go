package main

import (
	"strings"
	"testing"
	"time"
)

// The failover checker puts each key executed more than once on the last
// promotion that began before its second execution, and keeps the ones
// with no promotion before them apart.
func TestAttributeNamesEachDuplicateOnItsPromotion(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	proms := []*promotion{{n: 1, killed: at(10)}, {n: 2, killed: at(20)}}
	before := attribute(map[string][]time.Time{
		"once":         {at(9)},
		"across-1":     {at(9.9), at(12)},
		"thrice-2":     {at(25), at(19), at(21)}, // out of order: the second is at 21
		"before-any":   {at(1), at(2)},
		"after-kill-1": {at(10), at(10)},
	}, proms, start)
	if len(before) != 1 || !strings.Contains(before[0], "key before-any executed 2 times") {
		t.Errorf("before any promotion: %q", before)
	}
	if got := proms[0].duplicateCount; got != 2 || len(proms[0].duplicates) != 2 {
		t.Errorf("promotion 1: %d duplicates %q; want across-1 and after-kill-1, one each", got, proms[0].duplicates)
	}
	if got := proms[1].duplicateCount; got != 2 || len(proms[1].duplicates) != 1 ||
		proms[1].duplicates[0] != "key thrice-2 executed 3 times (at +19.000s, +21.000s, +25.000s)" {
		t.Errorf("promotion 2: %d duplicates %q; want thrice-2, twice", got, proms[1].duplicates)
	}
}
