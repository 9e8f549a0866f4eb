package backend

import (
	"sync"
	"time"
)

// LineLimiter is the once-a-second log line of the module and its
// backends, for events that may come a thousand a second (a store down
// under load, a replica short of acknowledgements): for each key, the
// first event is written at once; the ones that follow within Every are
// gathered (Add's add, into the key's A) and written as one line when
// Every ends, standing for all of them. A window with nothing gathered
// ends the key's turn, and its next event is written at once again. A
// line held back is written even if no event follows, so that the last
// second of an outage is told too.
type LineLimiter[K comparable, A any] struct {
	// Write writes one line for what acc gathered for key. It is called
	// without the limiter's lock.
	Write func(key K, acc A)
	// Every is the window; 0 is a second.
	Every time.Duration
	// After runs f once d has passed; nil is time.AfterFunc (tests
	// replace it).
	After func(d time.Duration, f func())

	mu   sync.Mutex
	held map[K]*gathered[A] // present while a window runs
}

type gathered[A any] struct {
	acc A
	n   int // events gathered in acc
}

// Add records one event of key: add gathers it into the key's A.
func (l *LineLimiter[K, A]) Add(key K, add func(acc *A)) {
	l.mu.Lock()
	if g := l.held[key]; g != nil {
		add(&g.acc)
		g.n++
		l.mu.Unlock()
		return
	}
	if l.held == nil {
		l.held = make(map[K]*gathered[A])
	}
	g := &gathered[A]{}
	l.held[key] = g
	var first A
	add(&first)
	l.mu.Unlock()
	l.Write(key, first)
	l.after(func() { l.flush(key, g) })
}

// Flush writes what was gathered for key at once, and ends its window: for
// a line that must come before another (a recovery's).
func (l *LineLimiter[K, A]) Flush(key K) {
	l.mu.Lock()
	g := l.held[key]
	delete(l.held, key)
	l.mu.Unlock()
	if g != nil && g.n > 0 {
		l.Write(key, g.acc)
	}
}

// flush writes what was gathered for key in window g, and opens another;
// with nothing gathered, key's turn ends. A window that Flush ended is
// no longer key's.
func (l *LineLimiter[K, A]) flush(key K, g *gathered[A]) {
	l.mu.Lock()
	if l.held[key] != g {
		l.mu.Unlock()
		return
	}
	if g.n == 0 {
		delete(l.held, key)
		l.mu.Unlock()
		return
	}
	acc := g.acc
	*g = gathered[A]{}
	l.mu.Unlock()
	l.Write(key, acc)
	l.after(func() { l.flush(key, g) })
}

func (l *LineLimiter[K, A]) after(f func()) {
	every := l.Every
	if every <= 0 {
		every = time.Second
	}
	if l.After != nil {
		l.After(every, f)
		return
	}
	time.AfterFunc(every, f)
}
