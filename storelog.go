package idempotency

// The log lines of store errors under an outage: one line a second per
// store, with the number of requests it stands for, rather than one per
// request (a store down under a thousand requests a second would
// otherwise write a thousand lines a second).

import (
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// storeErrorLogEvery is how often at most a store's errors of one kind
// are logged.
const storeErrorLogEvery = time.Second

// storeErrorLog writes the log lines of the answers that say the store
// failed (outcome store_error: fail_closed's 503, fail_open's pass, a full
// store), per store and message: the first at once, with requests 1; the
// next ones held back and counted, and written as one line every
// storeErrorLogEvery, with requests (how many it stands for) and the
// fields of the last of them (its key_hash, request_id, backend and
// error). A line held back is written a second after the previous one
// even if no request follows, so that the last second of an outage is
// counted too. Each request's own outcome (access log, placeholders,
// metrics) is unchanged.
type storeErrorLog struct {
	clock clock
	every time.Duration

	mu   sync.Mutex
	held map[storeErrorKey]*heldLine // present while lines are due within every
}

// storeErrorKey is what lines are grouped by.
type storeErrorKey struct {
	store storage.Store
	msg   string
}

// heldLine is the requests held back since the last line.
type heldLine struct {
	logger *zap.Logger // the last request's handler's
	level  zapcore.Level
	fields []zap.Field // the last request's
	n      int
}

// storeErrors is the process's storeErrorLog: stores are shared by the
// handlers of a configuration and across reloads.
var storeErrors = newStoreErrorLog(wallClock{}, storeErrorLogEvery)

func newStoreErrorLog(c clock, every time.Duration) *storeErrorLog {
	return &storeErrorLog{clock: c, every: every, held: make(map[storeErrorKey]*heldLine)}
}

// log logs, or holds back and counts, the line msg at level with fields
// of one request whose handler uses store and logger.
func (l *storeErrorLog) log(store storage.Store, logger *zap.Logger, level zapcore.Level, msg string, fields []zap.Field) {
	k := storeErrorKey{store: store, msg: msg}
	l.mu.Lock()
	if h := l.held[k]; h != nil {
		h.logger, h.level, h.fields = logger, level, fields
		h.n++
		l.mu.Unlock()
		return
	}
	l.held[k] = &heldLine{}
	l.mu.Unlock()
	writeStoreErrorLine(logger, level, msg, fields, 1)
	l.clock.AfterFunc(l.every, func() { l.flush(k) })
}

// flush writes the line held back for k, if any, and waits another
// every; with none, k's window ends and the next request logs at once.
func (l *storeErrorLog) flush(k storeErrorKey) {
	l.mu.Lock()
	h := l.held[k]
	if h.n == 0 {
		delete(l.held, k)
		l.mu.Unlock()
		return
	}
	line := *h
	*h = heldLine{}
	l.mu.Unlock()
	writeStoreErrorLine(line.logger, line.level, k.msg, line.fields, line.n)
	l.clock.AfterFunc(l.every, func() { l.flush(k) })
}

func writeStoreErrorLine(logger *zap.Logger, level zapcore.Level, msg string, fields []zap.Field, n int) {
	if c := logger.Check(level, msg); c != nil {
		all := make([]zap.Field, 0, len(fields)+1)
		all = append(all, zap.Int("requests", n))
		c.Write(append(all, fields...)...)
	}
}
