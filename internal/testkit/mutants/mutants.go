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
		Old:    "if not r[1] or r[1] ~= ARGV[1] then return 0 end\nredis.call('HDEL', key, 't', 'w')",
		New:    "if not r[1] then return 0 end\nredis.call('HDEL', key, 't', 'w')",
	},
	{
		Name: "ttl-ignored", Audit: true,
		Breaks: "records kept for a day whatever ttl says: a retry after ttl is replayed instead of running",
		File:   "keeper.go",
		Old:    "err := k.store.Complete(detach(ctx), key, token, resp, k.ttl)",
		New:    "err := k.store.Complete(detach(ctx), key, token, resp, 24*time.Hour)",
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
		File:   "observe.go",
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
		Name:   "store-closed-under-ping",
		Breaks: "a store unloaded at once (caddy validate) is closed under its first ping: the warning says closed pool or canceled instead of the cause",
		File:   "backend/pool.go",
		Old:    "\tif p.startPing != nil {\n\t\t<-p.startPing\n\t}\n",
		New:    "",
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
