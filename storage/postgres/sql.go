package postgres

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Record states as stored in the state column. A record whose outcome
// is unknown (storage.Response.OutcomeUnknown) is a completed record of a
// state of its own, so that a store of an earlier version refuses it
// ("state 3": storage.ErrCorrupt) rather than replay it as a response.
const (
	stateInFlight       = 1
	stateCompleted      = 2
	stateOutcomeUnknown = 3
)

// statements holds the SQL of every operation, with the table name
// interpolated once in New. Everything else is a bind parameter, and pgx
// prepares each statement once per connection (its statement cache), so an
// operation is one round trip after that.
//
// Durations travel as microseconds ($n::bigint * interval '1 microsecond'),
// timestamptz's resolution, and every time is computed from the server's
// now(): instances with skewed clocks still agree on what has expired.
type statements struct {
	guard, renewBatch, asyncCommit            string
	setLockTimeout                            string
	reserve, lookup                           string
	complete, release, renew, get, delete     string
	confirm                                   string
	getByHash, deleteByHash, listInFlight     string
	listOutcomeUnknown, releaseOutcomeUnknown string
	watch                                     string
	cleanupBatch, tryCleanupLock, cleanupDone string
	columns                                   string
}

// columnNames are the table's columns, every one of which the store reads
// or writes.
const columnNames = `scope, key, fingerprint, state, token, status, headers, body, body_omitted, created_at, expires_at, detail`

// columnTypes compares each column with a value of the type the store
// writes: PostgreSQL refuses a comparison of another type (a fingerprint
// made text) when it plans the statement, before it reads any row.
const columnTypes = ` AND scope = ''::text AND key = ''::text AND fingerprint = ''::bytea AND state = 0::smallint` +
	` AND token = 0::bigint AND status = 0 AND headers = ''::bytea AND body = ''::bytea AND body_omitted = false` +
	` AND created_at = now() AND expires_at = now() AND detail = ''::bytea`

// existing is the column list that describes a live record to a caller
// that did not get it: whether the fingerprint matches, state, times, and
// the response only for a replay (same fingerprint, completed), so that a
// mismatch or a conflict never ships a body.
const existing = `e.fingerprint = $3 AS same, e.state, e.created_at, e.expires_at,
	COALESCE(e.status, 0) AS status,
	CASE WHEN e.fingerprint = $3 AND e.state <> 1 THEN e.headers END AS headers,
	CASE WHEN e.fingerprint = $3 AND e.state <> 1 THEN e.body END AS body,
	e.body_omitted, e.detail`

// keyHash is a row's storage.Key.Hash, as bytes.
const keyHash = `substring(sha256(
	CASE WHEN octet_length(scope) < 128 THEN set_byte('\x00'::bytea, 0, octet_length(scope))
	ELSE set_byte(set_byte('\x0000'::bytea, 0, (octet_length(scope) & 127) | 128), 1, octet_length(scope) >> 7) END
	|| convert_to(scope, 'UTF8') || convert_to(key, 'UTF8')) from 1 for 8)`

// byHash is the condition of getByHash and deleteByHash.
const byHash = keyHash + ` = $1`

// renewWait is renewBatch for the leases whose rows were locked: it waits
// for each row in turn (see Store.RenewBatch).
func (st statements) renewWait() string {
	return strings.Replace(st.renewBatch, "FOR NO KEY UPDATE SKIP LOCKED) e", "FOR NO KEY UPDATE) e", 1)
}

func newStatements(table string, lockWait time.Duration) statements {
	q := func(s string) string { return strings.ReplaceAll(s, "{table}", table) }
	return statements{
		// columns reads no row, but fails naming the table, or the first
		// column, that does not exist, or (at the position of its
		// comparison) the first column of another type than the store
		// writes (Ping).
		columns: q(`SELECT ` + columnNames + ` FROM {table} WHERE false` + columnTypes),
		// guard opens every pipeline of reserves, completions and releases
		// (see runBatch). Its UPDATE changes no row, but it takes the
		// table's ROW EXCLUSIVE lock, the lock the statements after it
		// take: a wait for the table itself (a migration's ACCESS
		// EXCLUSIVE lock, CREATE INDEX's SHARE lock) happens here, bounded
		// by the operation's Timeout alone, and is an outage like any
		// slow server. Then it sets lock_timeout for the rest of the
		// transaction only: a statement after it waits for a row that
		// another transaction holds for at most the store's lock wait
		// (Options.LockWait), and then fails with lock_not_available
		// (55P03), which the store reports as storage.ErrBusy for that
		// key alone. It writes nothing: a transaction of reads (a replay)
		// stays one without a WAL flush.
		guard: q(fmt.Sprintf(`WITH locked AS (UPDATE {table} SET token = token WHERE false RETURNING 1)
SELECT set_config('lock_timeout', '%dms', true)`, lockTimeoutMillis(lockWait))),

		// renewBatch renews many leases in one statement, for
		// Store.RenewBatch: $1 to $4 are the scopes, keys, tokens and
		// lease lengths (microseconds), one element per lease. Like renew,
		// it takes only in-flight rows that still hold the lease's token,
		// whatever their expiry. It never waits for a row: FOR NO KEY
		// UPDATE SKIP LOCKED passes over a row another transaction holds
		// (the request's own completion, an operator's open transaction),
		// and that lease is reported busy, to be renewed on the next tick.
		// The LATERAL subquery looks each lease up by the primary key,
		// however many rows the table holds. It answers one row per lease:
		// its ordinal and 0 (renewed), 1 (lost: no row holds the token) or
		// 2 (busy: the row holds the token but was locked).
		// A lease runs from when its row is renewed (clock_timestamp), not
		// from when the transaction began: a waiting renewal (renewWait)
		// may have waited for its row for longer than the lease.
		renewBatch: q(`WITH req AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) WITH ORDINALITY AS r(scope, key, token, lease, i)
), locked AS (
	SELECT req.i FROM req CROSS JOIN LATERAL (
		SELECT FROM {table} e
		WHERE e.scope = req.scope AND e.key = req.key AND e.state = 1 AND e.token = req.token
		FOR NO KEY UPDATE SKIP LOCKED) e
), renewed AS (
	UPDATE {table} t SET expires_at = clock_timestamp() + l.lease * interval '1 microsecond'
	FROM (SELECT req.scope, req.key, req.token, max(req.lease) AS lease
		FROM locked JOIN req USING (i) GROUP BY req.scope, req.key, req.token) l
	WHERE t.scope = l.scope AND t.key = l.key AND t.state = 1 AND t.token = l.token
	RETURNING t.scope, t.key, t.token
)
SELECT req.i, CASE WHEN r.scope IS NOT NULL THEN 0 WHEN e.scope IS NOT NULL THEN 2 ELSE 1 END::smallint
FROM req
LEFT JOIN (SELECT DISTINCT scope, key, token FROM renewed) r
	ON r.scope = req.scope AND r.key = req.key AND r.token = req.token
LEFT JOIN {table} e
	ON e.scope = req.scope AND e.key = req.key AND e.state = 1 AND e.token = req.token`),

		// asyncCommit goes before renewBatch, in the same transaction: a
		// renewal does not wait for its WAL flush (see Store.RenewBatch).
		asyncCommit: `SELECT set_config('synchronous_commit', 'off', true)`,
		// setLockTimeout bounds a waiting renewal's wait for each row.
		setLockTimeout: `SELECT set_config('lock_timeout', $1, true)`,

		// The live row, if the statement's snapshot shows one, answers at
		// once and nothing is written: a replay or a conflict is a
		// read-only transaction (no row lock, no WAL flush on commit).
		// Otherwise the INSERT decides (insert-first: of concurrent
		// reservers the primary key lets exactly one in), and a row that
		// exists but has expired (completed) or whose lease lapsed (in
		// flight) is taken over by its DO UPDATE, whose WHERE PostgreSQL
		// evaluates on the latest, locked version of the row. When the
		// INSERT conflicts with a live row the snapshot did not show, the
		// statement returns nothing: see Store.Reserve.
		//
		// A row that is there but not live is first locked with SKIP
		// LOCKED (stale): a reserve never queues on a row another
		// transaction holds (batch.go), and a takeover never waits for an
		// outside lock to go, which would let it in before the owner's
		// renewal, queued on the same lock (renew.go). Such a row answers
		// "locked" (kind 2) and nothing is written. A lapsed lease is not
		// taken over when $6 is false (the store found its row locked a
		// moment ago, see Store.sawLocked): it answers "held off" (kind
		// 3). The first column is the kind of answer: 0 the live row, 1
		// acquired.
		reserve: q(`WITH live AS (
	SELECT ` + existing + `
	FROM {table} e
	WHERE e.scope = $1 AND e.key = $2 AND e.expires_at > now()
), stale AS (
	SELECT e.state, NOT EXISTS (
		SELECT FROM {table} f WHERE f.scope = $1 AND f.key = $2 FOR NO KEY UPDATE SKIP LOCKED) AS locked
	FROM {table} e
	WHERE e.scope = $1 AND e.key = $2 AND NOT EXISTS (SELECT FROM live)
), refused AS (
	SELECT CASE WHEN locked THEN 2 ELSE 3 END::smallint AS kind
	FROM stale WHERE locked OR (state = 1 AND NOT $6::bool)
), taken AS (
	INSERT INTO {table} AS r (scope, key, fingerprint, state, token, created_at, expires_at)
	SELECT $1::text, $2::text, $3::bytea, 1, $4::bigint, now(), now() + $5::bigint * interval '1 microsecond'
	WHERE NOT EXISTS (SELECT FROM live) AND NOT EXISTS (SELECT FROM refused)
	ON CONFLICT (scope, key) DO UPDATE SET
		fingerprint = excluded.fingerprint, state = 1, token = excluded.token,
		status = NULL, headers = NULL, body = NULL, body_omitted = false, detail = NULL,
		created_at = excluded.created_at, expires_at = excluded.expires_at
	WHERE r.expires_at <= now()
	RETURNING 1
)
SELECT 1::smallint, true, 1::smallint, now(), now(), 0, NULL::bytea, NULL::bytea, false, NULL::bytea FROM taken
UNION ALL
SELECT 0::smallint, live.* FROM live
UNION ALL
SELECT kind, false, 0::smallint, now(), now(), 0, NULL::bytea, NULL::bytea, false, NULL::bytea FROM refused`),

		// lookup is reserve's live row on its own, read in a new statement
		// (hence a new snapshot) when reserve returned no row.
		lookup: q(`SELECT ` + existing + `
FROM {table} e
WHERE e.scope = $1 AND e.key = $2 AND e.expires_at > now()`),

		// Complete, Release and Renew name the lease by its token (fencing)
		// and ignore expiry: a lapsed lease that nobody took over is still
		// its owner's. A completed row keeps its lease's token, so that the
		// completion sent again finds its own record (see confirm).
		//
		// complete is batched (batch.go), and so never waits for a row
		// another transaction holds: it locks the lease's row with SKIP
		// LOCKED first, and answers whether it completed the lease and,
		// if not, whether the row was locked (the lease may still be its
		// own: it tries again) rather than gone.
		complete: q(`WITH locked AS (
	SELECT FROM {table} e
	WHERE e.scope = $1 AND e.key = $2 AND e.state = 1 AND e.token = $3 AND NOT EXISTS (
		SELECT FROM {table} f WHERE f.scope = $1 AND f.key = $2 FOR NO KEY UPDATE SKIP LOCKED)
), done AS (
	UPDATE {table} SET state = $10::smallint,
		status = $4, headers = $5, body = $6, body_omitted = $7,
		expires_at = now() + $8::bigint * interval '1 microsecond', detail = $9
	WHERE scope = $1 AND key = $2 AND state = 1 AND token = $3 AND NOT EXISTS (SELECT FROM locked)
	RETURNING 1
)
SELECT EXISTS (SELECT FROM done), EXISTS (SELECT FROM locked)`),
		// confirm rewrites, unchanged, the row a lease completed: a commit
		// of its own, which waits for a synchronous standby as the
		// completion's did (see Store.confirm).
		confirm: q(`UPDATE {table} SET token = token WHERE scope = $1 AND key = $2 AND state <> 1 AND token = $3`),
		release: q(`DELETE FROM {table} WHERE scope = $1 AND key = $2 AND state = 1 AND token = $3`),
		renew: q(`UPDATE {table} SET expires_at = now() + $4::bigint * interval '1 microsecond'
WHERE scope = $1 AND key = $2 AND state = 1 AND token = $3`),

		get: q(`SELECT fingerprint, state, token, created_at, expires_at,
	COALESCE(status, 0), headers, CASE WHEN $3 THEN body END, body_omitted
FROM {table} WHERE scope = $1 AND key = $2 AND expires_at > now()`),
		delete: q(`DELETE FROM {table} WHERE scope = $1 AND key = $2 AND expires_at > now()`),

		// One batch of expired rows: completed ones once expired, in-flight
		// ones LapsedGrace ($1) after their lease lapsed. The ctids are
		// picked through the expires_at index and deleted by a TID scan;
		// the condition is repeated on the DELETE itself because a row
		// taken over between the two steps is a new, live version that
		// PostgreSQL re-checks (and then keeps) instead of deleting.
		cleanupBatch: q(`DELETE FROM {table}
WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM {table}
	WHERE expires_at <= now()
		AND (state <> 1 OR expires_at <= now() - $1::bigint * interval '1 microsecond')
	LIMIT $2
	FOR UPDATE SKIP LOCKED))
	AND expires_at <= now()
	AND (state <> 1 OR expires_at <= now() - $1::bigint * interval '1 microsecond')`),
		// The rows whose key's Hash (storage.Key.Hash) is $1: the first
		// 8 bytes of SHA-256 over the scope's length as a uvarint, the
		// scope and the key, computed for every live row (a scan, for
		// operators' occasional lookups). The uvarint is spelled out for
		// scopes shorter than 16384 bytes (the module's are 64).
		getByHash: q(`SELECT fingerprint, state, token, created_at, expires_at,
	COALESCE(status, 0), headers, CASE WHEN $2 THEN body END, body_omitted
FROM {table} WHERE expires_at > now() AND ` + byHash),
		deleteByHash: q(`DELETE FROM {table} WHERE expires_at > now() AND ` + byHash),
		// The in-flight rows, by key hash: few (requests running now), so
		// hashing each is cheap; the table scan is bounded by ScanTimeout.
		listInFlight: q(`SELECT kh, fingerprint, token, created_at, expires_at FROM (
	SELECT encode(` + keyHash + `, 'hex') AS kh, fingerprint, token, created_at, expires_at
	FROM {table} WHERE state = 1 AND expires_at > now()) r
WHERE kh COLLATE "C" > $1 ORDER BY kh COLLATE "C" LIMIT $2`),

		// The outcome-unknown rows, by key hash, as listInFlight lists,
		// and the delete of those of one key hash ($1) that are still
		// outcome-unknown: the condition is on the row the DELETE locks.
		listOutcomeUnknown: q(`SELECT kh, fingerprint, created_at, expires_at, COALESCE(status, 0), headers FROM (
	SELECT encode(` + keyHash + `, 'hex') AS kh, fingerprint, created_at, expires_at, status, headers
	FROM {table} WHERE state = 3 AND expires_at > now()) r
WHERE kh COLLATE "C" > $1 ORDER BY kh COLLATE "C" LIMIT $2`),
		releaseOutcomeUnknown: q(`DELETE FROM {table} WHERE state = 3 AND expires_at > now() AND ` + byHash),

		// What a waiter's poller reads (see wait.go): the state, the
		// lease's token and the microseconds it has left, rounded up (so
		// that a lease with any time left reads as positive) and bounded
		// both ways to stay within a bigint whatever the row holds.
		watch: q(`SELECT state, token,
	GREATEST(LEAST(ceil(extract(epoch FROM expires_at - now()) * 1000000), 3153600000000000), -1)::bigint
FROM {table} WHERE scope = $1 AND key = $2`),

		tryCleanupLock: `SELECT pg_try_advisory_lock($1)`,
		cleanupDone:    `SELECT pg_advisory_unlock($1)`,
	}
}

// lockTimeoutMillis is d as lock_timeout takes it: whole milliseconds,
// rounded up (0 would turn lock_timeout off), at most the setting's
// largest value.
func lockTimeoutMillis(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	return min(max(ms, 1), math.MaxInt32)
}
