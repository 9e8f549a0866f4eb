package backend

import (
	"slices"
	"testing"
	"time"
)

// TestLineLimiterWritesTheFirstAtOnceAndTheRestOnceAWindow: the first
// event of a key is written at once; the ones within the window are one
// line when it ends; a quiet window ends the key's turn; Flush writes at
// once and ends the window, and that window's timer then writes nothing
// of the next window's.
func TestLineLimiterWritesTheFirstAtOnceAndTheRestOnceAWindow(t *testing.T) {
	var lines []int
	var due []func()
	l := LineLimiter[string, int]{
		Write: func(_ string, n int) { lines = append(lines, n) },
		After: func(d time.Duration, f func()) {
			if d != time.Second {
				t.Errorf("a window of %v, want the default second", d)
			}
			due = append(due, f)
		},
	}
	count := func(n *int) { *n++ }
	for range 5 {
		l.Add("k", count)
	}
	if !slices.Equal(lines, []int{1}) {
		t.Fatalf("lines at once %v, want the first event alone", lines)
	}
	due[0]()
	if !slices.Equal(lines, []int{1, 4}) {
		t.Fatalf("lines after the window %v, want the other 4 in one", lines)
	}
	due[1]() // quiet: the turn ends
	l.Add("k", count)
	if !slices.Equal(lines, []int{1, 4, 1}) || len(due) != 3 {
		t.Fatalf("after a quiet window: lines %v, %d windows; want a line at once and a window", lines, len(due))
	}
	l.Add("k", count)
	l.Flush("k")
	if !slices.Equal(lines, []int{1, 4, 1, 1}) {
		t.Fatalf("after Flush: %v, want the gathered event written at once", lines)
	}
	l.Add("k", count) // a new window, written at once
	l.Add("k", count) // gathered into it
	due[2]()          // the flushed window's timer: not this window's
	if !slices.Equal(lines, []int{1, 4, 1, 1, 1}) {
		t.Fatalf("a flushed window's timer wrote for the next: %v", lines)
	}
	due[3]()
	if !slices.Equal(lines, []int{1, 4, 1, 1, 1, 1}) {
		t.Fatalf("the new window's own timer: %v, want its gathered event", lines)
	}
}
