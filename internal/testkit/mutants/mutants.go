// Package mutants is the project's set of planted bugs: plausible
// mistakes, each a one-place change of the source, that the tests must
// catch. The runner (internal/testkit/cmd/mutants, make mutants) plants each in a
// copy of the tree and says which tier of tests catches it, and how fast:
// a test suite earns trust by failing, and a randomized test that never
// fails on a planted bug finds nothing new either.
package mutants

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Mutant is one planted bug: in File, Old (which occurs exactly once)
// becomes New.
type Mutant struct {
	Name string
	// Breaks says in one line what the bug breaks.
	Breaks string
	// Audit marks the twelve bugs of the mutation audit that the
	// randomized test at its make test budget must catch (at least ten).
	Audit          bool
	File, Old, New string
}

// All are the planted bugs.
var All = []Mutant{
	{
		Name: "renew-cadence", Audit: true,
		Breaks: "leases renewed once a lease instead of ten times: a lease lapses between renewals and a retry takes the key over",
		File:   "renewer.go",
		Old:    "\t\tevery := length / renewals\n",
		New:    "\t\tevery := length\n",
	},
	{
		Name: "redis-complete-unfenced", Audit: true,
		Breaks: "Redis Complete ignores the lease token: an owner whose lease was taken over overwrites the new owner's record",
		File:   "storage/redis/scripts.go",
		Old:    "if not r[1] or r[1] ~= ARGV[1] then\n  if r[3] and r[3] == ARGV[1] then",
		New:    "if not r[1] then\n  if r[3] and r[3] == ARGV[1] then",
	},
	{
		Name: "ttl-ignored", Audit: true,
		Breaks: "records kept for a day whatever ttl says: a retry after ttl is replayed instead of running",
		File:   "keeper.go",
		Old:    "err := k.store.Complete(detach(ctx), key, token, resp, k.ttl)",
		New:    "err := k.store.Complete(detach(ctx), key, token, resp, 24*time.Hour)",
	},
	{
		Name:   "ttl-early",
		Breaks: "records expire at a quarter of ttl: a retry well within ttl runs again (the judges' allowance for expired records must not hide it)",
		File:   "keeper.go",
		Old:    "err := k.store.Complete(detach(ctx), key, token, resp, k.ttl)",
		New:    "err := k.store.Complete(detach(ctx), key, token, resp, k.ttl/4)",
	},
	{
		Name: "aftercare-drops", Audit: true,
		Breaks: "a completion the store could not take is dropped, not retried: the key stays in flight until its lease lapses, then runs again",
		File:   "keeper.go",
		Old:    "\t\tk.aftercare.add(&chore{kind: choreComplete, key: key, token: token, resp: resp, ttl: k.ttl, until: k.aftercareDeadline(), lease: l.keep()})\n",
		New:    "\t\t// dropped\n",
	},
	{
		Name: "pg-batch-no-rerun", Audit: true,
		Breaks: "a PostgreSQL batch rolled back by one locked row fails its other statements instead of sending them again",
		File:   "storage/postgres/batch.go",
		Old:    "\t\t\tif i != culprit {\n\t\t\t\tagain = append(again, it)\n\t\t\t}\n",
		New:    "\t\t\tif i != culprit {\n\t\t\t\tit.result = batch[culprit].result\n\t\t\t}\n",
	},
	{
		Name: "scope-dropped", Audit: true,
		Breaks: "the scope left out of the record key: two clients sending the same key share one record",
		File:   "keyed.go",
		Old:    "\tk.key = storage.Key{Scope: scope, ID: id}\n",
		New:    "\tk.key = storage.Key{Scope: scope[:0], ID: id}\n",
	},
	{
		Name: "observe-takes", Audit: true,
		Breaks: "an observing handler marks the request as taken: an enforcing handler inside it passes every request through",
		File:   "mode.go",
		Old:    "\tkeyHash: placeholderObservedKeyHash,",
		New:    "\tkeyHash: placeholderKeyHash,",
	},
	{
		Name: "fingerprint-skipped-on-replay", Audit: true,
		Breaks: "a completed record is replayed to any request with its key, whatever the request (no 422)",
		File:   "storage/memory/entry.go",
		Old:    "\tcase !bytes.Equal(e.fp, fp):\n",
		New:    "\tcase !bytes.Equal(e.fp, fp) && e.resp == nil:\n",
	},
	{
		Name: "5xx-recorded", Audit: true,
		Breaks: "5xx answers recorded instead of freeing the key: a retry after an upstream failure is replayed the failure",
		File:   "handler.go",
		Old:    "\tcase h.policy.releaseOn.has(status):\n",
		New:    "\tcase h.policy.releaseOn.has(status) && status < 500:\n",
	},
	{
		Name: "stall-per-write", Audit: true,
		Breaks: "a client judged gone by how long one write takes, not by progress: a slow reader loses its answer",
		File:   "recorder.go",
		Old:    "const progressPiece = 4 << 10\n",
		New:    "const progressPiece = 1 << 30\n",
	},
	{
		Name: "abort-missing", Audit: true,
		Breaks: "a response cut short ends cleanly: a client that resumes takes part of the answer for all of it",
		File:   "handler.go",
		Old:    "\tif rec.cutShort() {\n",
		New:    "\tif false && rec.cutShort() {\n",
	},
	{
		Name: "refusal-kept", Audit: true,
		Breaks: "refusal records never give way: made-up credentials refused with 404 fill the memory store",
		File:   "storage/memory/sweep.go",
		Old:    "\t\tif !s.evictRefusal(0, false) {\n",
		New:    "\t\tif true {\n",
	},
	{
		Name:   "renewals-one-by-one",
		Breaks: "leases renewed one round trip each, not in a batch per store: renewals fall behind with many leases on a slow store",
		File:   "renewer.go",
		Old:    "\tr.batcher, _ = store.(storage.BatchRenewer)\n",
		New:    "\tr.batcher = nil\n",
	},
	{
		Name:   "pg-no-lock-wait",
		Breaks: "PostgreSQL statements wait for a locked row as long as their deadline: one locked row holds up the batches of other keys",
		File:   "storage/postgres/postgres.go",
		Old:    "\treturn min(max(timeout/4, minLockWait), maxLockWait)\n",
		New:    "\treturn time.Hour\n",
	},
	{
		Name:   "pg-errors-unscrubbed",
		Breaks: "PostgreSQL errors keep the DSN's password: a misspelt scheme puts it in the start-up warning, every request's log line and the admin API",
		File:   "storage/postgres/errors.go",
		Old:    "\treturn redact.Wrap(s.meaning(ctx, op, err), s.secrets)\n",
		New:    "\treturn redact.Wrap(s.meaning(ctx, op, err), nil)\n",
	},
	{
		Name:   "pg-ping-no-columns",
		Breaks: "the PostgreSQL ping only asks whether the server answers: a missing table or column shows as ok while every keyed request gets 503",
		File:   "storage/postgres/postgres.go",
		Old:    "\tif _, err := s.pool.Exec(ctx, s.sql.columns); err != nil {\n",
		New:    "\tif err := s.pool.Ping(ctx); err != nil {\n",
	},
	{
		Name:   "pool-parameter-unchecked",
		Breaks: "a PostgreSQL DSN's pool_health_check_period goes unchecked: 0s panics in pgxpool's goroutine, and a reload kills Caddy",
		File:   "storage/postgres/pool.go",
		Old:    "\tcase cfg.HealthCheckPeriod < MinHealthCheckPeriod:\n",
		New:    "\tcase false:\n",
	},
	{
		Name:   "pg-takeover-queues",
		Breaks: "a PostgreSQL reserve queues on the row of a lapsed lease that another transaction holds: when the lock goes, the takeover lands before the owner's renewal, and a live request's key runs twice",
		File:   "storage/postgres/sql.go",
		Old:    "FOR NO KEY UPDATE SKIP LOCKED) AS locked",
		New:    "FOR NO KEY UPDATE) AS locked",
	},
	{
		Name:   "store-not-watched",
		Breaks: "a store is pinged at start only: its health gauge (store_up) stays 1 through an outage that no request meets, and nobody is paged",
		File:   "backend/pool.go",
		Old:    "\tok := p.pingAtStart(logger, id, where)\n",
		New:    "\tok := p.pingAtStart(logger, id, where)\n\treturn\n",
	},
	{
		Name:   "unknown-outcome-freed",
		Breaks: "a handler error before any status frees the key whatever it says: a response-header timeout or a reset after the request reached the upstream runs the retry again",
		File:   "failure.go",
		Old:    "\tif f.panicked || f.invalid != 0 || f.err == nil || f.connected {\n\t\treturn false, \"\"\n\t}\n",
		New:    "\tif f.panicked || f.invalid != 0 || f.err == nil {\n\t\treturn false, \"\"\n\t}\n\tif true {\n\t\treturn true, \"the handler failed\"\n\t}\n",
	},
	{
		Name:   "fallback-status-frees",
		Breaks: "the replacer's upstream status frees the key whatever came after it: a handle_response route's reverse_proxy that failed after sending leaves the first upstream's 503, and the retry runs the fallback again",
		File:   "failure.go",
		Old:    "\tif conns != 1 {\n",
		New:    "\tif conns > 1 {\n",
	},
	{
		Name:   "proxy-failure-status-frees",
		Breaks: "an earlier upstream's status frees the key though reverse_proxy failed after it: a handle_response route's fastcgi fallback that timed out after the primary's 503 is freed, and the retry runs the application again",
		File:   "failure.go",
		Old:    "ok && n == 0 && !proxyFailed(err) {\n",
		New:    "ok && n == 0 {\n",
	},
	{
		Name:   "untraced-attempt-unsent",
		Breaks: "an attempt no trace saw (fastcgi's transport dials on its own) counts as never sent: a last retry's dial error frees the key and the application runs again",
		File:   "failure.go",
		Old:    "\tif n > 0 && gets < n+1 && !noUpstream(err) {\n",
		New:    "\tif false && n > 0 && gets < n+1 && !noUpstream(err) {\n",
	},
	{
		Name:   "answered-upstream-unsent",
		Breaks: "an upstream's status set during the next handler does not mean the request was sent: over fastcgi, a handle_response 4xx after the application ran frees the key",
		File:   "failure.go",
		Old:    "\tif answered {\n",
		New:    "\tif false && answered {\n",
	},
	{
		Name:   "one-waiting-renewal",
		Breaks: "one PostgreSQL waiting renewal at a time: a second row locked from outside is only ever reported busy, its lease lapses and it is taken over when its lock goes",
		File:   "storage/postgres/postgres.go",
		Old:    "const maxWaitingRenewals = 4\n",
		New:    "const maxWaitingRenewals = 1\n",
	},
	{
		Name:   "detail-v2-as-v3",
		Breaks: "a record's detail of version 2 read with version 3's digests: after an upgrade every 422 on an earlier record names the method, path and every part as differing",
		File:   "fingerprint/detail.go",
		Old:    "\tif st.seed[0] < detailVersion {\n",
		New:    "\tif st.seed[0] < detailVersionV2 {\n",
	},
	{
		Name:   "host-not-folded",
		Breaks: "the scope's host taken as the client spelt it: Host LocalHost, LOCALHOST. or localhost:80 is a client of its own and the key runs again",
		File:   "scope.go",
		Old:    "\t\treturn foldHost(host), true\n",
		New:    "\t\treturn host, true\n",
	},
	{
		Name:   "coding-ignored",
		Breaks: "a coded body compared as its bytes: gzipped JSON is refused as invalid, key_json finds no key in it and passes it on unprotected",
		File:   "keyed.go",
		Old:    "\tif codings.Decoded() && body.Len() > 0 {\n",
		New:    "\tif false && codings.Decoded() && body.Len() > 0 {\n",
	},
	{
		Name:   "stall-between-writes",
		Breaks: "a write to the client stays pending for the stall watch once it has returned: the client of an upstream silent past the stall timeout after its first bytes is cut off",
		File:   "recorder.go",
		Old:    "\t\trec.writing.Store(0)\n\t}\n\treturn len(p), nil\n",
		New:    "\t}\n\treturn len(p), nil\n",
	},
	{
		Name:   "waiters-per-key-unbounded",
		Breaks: "one key's waiters may take every place in the wait: one client's retry storm gets every other client's retry 409 at once",
		File:   "wait.go",
		Old:    " ||\n\t\t!key.fits(size, knobs.MaxWaitersPerKey.Load(), bytes/4) {",
		New:    " {",
	},
	{
		Name:   "waiting-bytes-unbounded",
		Breaks: "waiting requests hold their bodies without a budget: a storm of retries with large bodies takes the instance's memory",
		File:   "wait.go",
		Old:    "\treturn s.places < places && (s.places == 0 || s.bytes+size <= bytes)\n",
		New:    "\treturn s.places < places\n",
	},
}

// Plant writes m into the tree at root, which must hold File with Old
// exactly once.
func (m Mutant) Plant(root string) error {
	path := filepath.Join(root, m.File)
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if n := strings.Count(string(src), m.Old); n != 1 {
		return fmt.Errorf("mutant %s: %s holds its code %d times, want once: update the mutant to the code", m.Name, m.File, n)
	}
	return os.WriteFile(path, []byte(strings.Replace(string(src), m.Old, m.New, 1)), 0o644)
}
