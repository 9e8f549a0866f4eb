package postgres

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/redact"
)

// What an error means to the caller. A caller may go on without the
// store (the Caddy module's fail_open) only after an error wrapping
// storage.ErrUnavailable: PostgreSQL could not be reached or did not
// answer in time. Every error that proves the server answered (a missing
// table, a permission, a constraint, a value it refused, a row the store
// cannot decode, a serialization failure that outlived the retries) does
// not wrap it, so that such a deployment mistake or corruption fails
// closed instead of silently running every request without
// idempotency. An error the store cannot place is treated as an answer.
// A server that refuses writes (read_only_sql_transaction, 25006: a
// standby, or a primary a failover demoted) is unavailable too: the
// deployment is right, the topology is changing (see ErrReadOnly).

//
// A row locked by another transaction is neither: the server answered
// that this key is busy. A statement that waited for such a row for the
// store's lock wait (Options.LockWait) fails with lock_not_available
// (55P03) after the guard statement that sets it (see statements.guard),
// and its error wraps storage.ErrBusy, never storage.ErrUnavailable:
// fail_open must not let a request through while the key's row is held
// (by a retry of that very request, perhaps). A lock_not_available
// anywhere else (the server's own lock_timeout, from the DSN, on a table
// lock) is an outage as before.

// SQLSTATEs the store tells apart.
const (
	serializationFailure = "40001"
	deadlockDetected     = "40P01"
	undefinedTable       = "42P01"
	undefinedColumn      = "42703"
	undefinedFunction    = "42883"
	invalidParamName     = "42602"
	undefinedObject      = "42704"
	lockNotAvailable     = "55P03"
	readOnlyTransaction  = "25006"
)

// readOnly reports whether err is read_only_sql_transaction: a write sent
// to a server that refuses writes (a standby, see ErrReadOnly).
func readOnly(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == readOnlyTransaction
}

// dropConnections closes every connection of the store's pools, idle ones
// now and those in use when they are released, so that the next
// statements connect afresh: after a failover, to the new primary (with a
// multi-host DSN and target_session_attrs=read-write).
func (s *Store) dropConnections() {
	s.pool.Reset()
	s.renewals.Reset()
}

// lockTimedOut reports whether err is lock_not_available: a statement
// that waited for a lock for longer than lock_timeout.
func lockTimedOut(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable
}

// unavailableCode reports whether a server error with SQLSTATE code
// means that the server cannot serve the store now, rather than an
// answer about the statement: a broken connection (class 08), a server
// shutting down, crashed or still starting (57P01, 57P02, 57P03), a
// session ended for idling (57P05), no connection slot left (53300), and
// a statement that ran out of time, cancelled by the store's own timeout
// or by the server's statement_timeout or lock_timeout (57014, 55P03;
// a row lock after the guard is storage.ErrBusy instead, see above).
func unavailableCode(code string) bool {
	if strings.HasPrefix(code, "08") {
		return true
	}
	switch code {
	case "57P01", "57P02", "57P03", "57P05", "53300", "57014", "55P03":
		return true
	}
	return false
}

// retryable reports whether err is PostgreSQL giving up on a statement
// that conflicted with a concurrent one: a serialization failure (which a
// database or role defaulting to REPEATABLE READ or SERIALIZABLE, or a
// pool that does not pin READ COMMITTED, produces) or a deadlock. The
// statement was rolled back, so running it again is safe.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == serializationFailure || pgErr.Code == deadlockDetected)
}

// serializationFailed reports whether err is a serialization failure,
// which a session at READ COMMITTED never gets.
func serializationFailed(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == serializationFailure
}

// maxAttempts bounds how many times one operation runs a statement that
// PostgreSQL rolled back for a conflict (see retryable).
const maxAttempts = 8

// retryPause waits before the next attempt: a random time, so that
// statements that conflicted once do not meet again in lockstep, up to a
// bound that doubles with every attempt from 1ms (under SERIALIZABLE,
// hundreds of statements on neighbouring keys can keep failing each
// other). All the pauses of one operation add up to at most 255ms. It
// returns false when ctx is done meanwhile.
func retryPause(ctx context.Context, attempt int) bool {
	return sleep(ctx, time.Duration(rand.Int64N(int64(time.Millisecond)<<min(attempt, maxAttempts))))
}

// retry runs fn, again while it fails with a retryable error, at most
// maxAttempts times, and returns its last error.
func retry(ctx context.Context, fn func() error) error {
	var err error
	for attempt := range maxAttempts {
		if err = fn(); !retryable(err) || attempt == maxAttempts-1 || !retryPause(ctx, attempt) {
			return err
		}
	}
	return err
}

// unavailable reports whether err, from a statement run under ctx, means
// that PostgreSQL could not be reached or did not answer in time.
func (s *Store) unavailable(ctx context.Context, err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// The server spoke (perhaps while refusing a connection).
		return unavailableCode(pgErr.Code)
	}
	var netErr net.Error
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return true
	case errors.Is(err, context.Canceled):
		return false // the caller gave up, not the server
	case errors.As(err, &netErr), pgconn.Timeout(err):
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, pgconn.ErrConnClosed):
		return true // the connection broke mid-conversation
	case errors.Is(err, pgconn.ErrReadOnlyConnection), errors.Is(err, pgconn.ErrStandbyConnection):
		return true // target_session_attrs=read-write or primary found no primary: a failover in progress
	case s.closed.Load():
		return true // closed with the store: nothing answers any more
	}
	return false
}

// fail wraps an error of operation op, run under ctx, with context and
// its meaning (see the top of this file). A missing table or column gets a
// hint, since with create_table off it is a deployment mistake rather than
// an outage. Every error leaves the store through fail, scrubbed of the
// connection string's passwords (redact.Wrap): a DSN pgx misread (a
// scheme typo) reaches the server as a parameter name, which the server's
// error quotes.
func (s *Store) fail(ctx context.Context, op string, err error) error {
	return redact.Wrap(s.meaning(ctx, op, err), s.secrets)
}

// meaning is fail without the scrubbing.
func (s *Store) meaning(ctx context.Context, op string, err error) error {
	var pgErr *pgconn.PgError
	var scanErr pgx.ScanArgError
	switch {
	case errors.Is(err, storage.ErrCorrupt), errors.Is(err, storage.ErrInvalid), errors.Is(err, storage.ErrBusy), errors.Is(err, storage.ErrNotReplicated):
		return fmt.Errorf("postgres %s: %w", op, err)
	case readOnly(err):
		// A failover demoted the server, or the DSN names a standby: as
		// an outage, the store cannot serve requests there.
		s.dropConnections()
		return fmt.Errorf("postgres %s: %w: %w: %w", op, storage.ErrUnavailable, ErrReadOnly, err)
	case errors.As(err, &scanErr):
		// A column holds what the store never writes (someone else wrote
		// the row, or changed the table).
		return fmt.Errorf("postgres %s: %w: %w", op, storage.ErrCorrupt, err)
	case errors.Is(ctx.Err(), context.Canceled) && !errors.Is(err, context.Canceled):
		// A statement the caller cancelled comes back as the server's
		// query_canceled, which must not read as a timeout.
		return fmt.Errorf("postgres %s: %w: %w", op, ctx.Err(), err)
	case s.unavailable(ctx, err):
		return fmt.Errorf("postgres %s: %w: %w", op, storage.ErrUnavailable, err)
	case errors.As(err, &pgErr) && (pgErr.Code == invalidParamName || pgErr.Code == undefinedObject) && errors.As(err, new(*pgconn.ConnectError)):
		// The server refused a setting of the start-up packet: pgx passes
		// every keyword it does not know on as one.
		return fmt.Errorf("postgres %s: the server refused a parameter of the dsn (a misspelt keyword, which pgx sends as a setting of the server): %w", op, err)
	case errors.Is(err, pgconn.ErrReadWriteConnection), errors.Is(err, pgconn.ErrPrimaryConnection):
		// target_session_attrs asks for a read-only server or a standby,
		// where the records cannot be written.
		return fmt.Errorf("postgres %s: no server of the dsn is what its target_session_attrs asks for, and the records need a server that takes writes "+
			"(target_session_attrs=read-write or primary, or none): %w", op, err)
	case errors.As(err, new(*tls.CertificateVerificationError)):
		return fmt.Errorf("postgres %s: the server's certificate does not verify as the dsn's sslmode asks (verify-ca, verify-full: sslrootcert names the CA): %w", op, err)
	case strings.Contains(err.Error(), "server refused TLS connection"):
		return fmt.Errorf("postgres %s: the server does not speak TLS, which the dsn's sslmode requires (require, verify-ca, verify-full): %w", op, err)
	case strings.Contains(err.Error(), "channel binding required"):
		return fmt.Errorf("postgres %s: the server cannot do what the dsn's channel_binding=require asks (SCRAM-SHA-256-PLUS over TLS): %w", op, err)
	case errors.As(err, &pgErr) && pgErr.Code == undefinedTable:
		hint := "create it with the statements `caddy idempotency schema` prints (docs/storage-postgres.md, The table), or turn create_table on"
		if s.opts.CreateTable {
			// Dropped after the store created it.
			s.schemaReady.Store(false)
			hint = "it will be created again on the next operation"
		}
		return fmt.Errorf("postgres %s: table %s does not exist (%s): %w", op, s.table, hint, err)
	case errors.As(err, &pgErr) && pgErr.Code == undefinedColumn && !s.opts.CreateTable:
		return fmt.Errorf("postgres %s: table %s lacks a column of this version (%s): %w", op, s.table, columnHint(s.table, pgErr.Message), err)
	case errors.As(err, &pgErr) && pgErr.Code == undefinedFunction && op == "ping":
		return fmt.Errorf("postgres %s: table %s has a column of another type (column %s: the table is not the one `caddy idempotency schema` prints; "+
			"create it with those statements, or turn create_table on for a new table): %w", op, s.table, columnAt(s.sql.columns, pgErr.Position), err)
	}
	return fmt.Errorf("postgres %s: %w", op, err)
}

// columnAt names the column compared at position pos (1-based, as
// PostgreSQL reports it) of the statement stmt: the word before it.
func columnAt(stmt string, pos int32) string {
	if pos < 1 || int(pos) > len(stmt) {
		return "?"
	}
	words := strings.Fields(stmt[:pos-1])
	if len(words) == 0 {
		return "?"
	}
	return words[len(words)-1]
}

// columnHint says how to fix a table that lacks the column PostgreSQL's
// message names (`column "detail" does not exist`).
func columnHint(table, msg string) string {
	_, col, _ := strings.Cut(msg, `"`)
	col, _, _ = strings.Cut(col, `"`)
	col = col[strings.LastIndexByte(col, '.')+1:]
	if col == "detail" {
		return "column detail: add it with the statements `caddy idempotency schema` prints, " +
			"ALTER TABLE " + table + " ADD COLUMN IF NOT EXISTS detail bytea, or turn create_table on"
	}
	if col == "" {
		col = "?"
	}
	return "column " + col + ": the table is not the one `caddy idempotency schema` prints (columns " + columnNames + "); " +
		"create it with those statements, or turn create_table on"
}

// secretsOf returns the password of cc and those its connection string
// holds, however pgx read it.
func secretsOf(cc *pgx.ConnConfig) []string {
	secrets := redact.Secrets(cc.ConnString())
	if cc.Password != "" && !slices.Contains(secrets, cc.Password) {
		secrets = append(secrets, cc.Password)
	}
	return secrets
}
