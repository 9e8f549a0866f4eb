package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Schema returns the DDL of table (default idempotency_keys when empty):
// the statements a store with CreateTable runs on first use, for operators
// who create the table themselves. Both are idempotent.
func Schema(table string) ([]string, error) {
	if table == "" {
		table = DefaultTable
	}
	quoted, err := sanitizeTable(table)
	if err != nil {
		return nil, err
	}
	return schemaDDL(quoted, indexName(table)), nil
}

// schemaDDL is the DDL for the quoted table name and bare index name.
//
// expires_at is the lease expiry while in flight and the record's expiry
// once completed; token is the lease (storage.Token as a bigint, 0 once
// completed); headers is storage.AppendHeader's encoding.
func schemaDDL(table, index string) []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + table + ` (
    scope        text        NOT NULL,
    key          text        NOT NULL,
    fingerprint  bytea       NOT NULL,
    state        smallint    NOT NULL,
    token        bigint      NOT NULL,
    status       integer,
    headers      bytea,
    body         bytea,
    body_omitted boolean     NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    detail       bytea,
    PRIMARY KEY (scope, key)
)`,
		`CREATE INDEX IF NOT EXISTS ` + pgx.Identifier{index}.Sanitize() + ` ON ` + table + ` (expires_at)`,
		// Tables made before the detail column existed get it.
		`ALTER TABLE ` + table + ` ADD COLUMN IF NOT EXISTS detail bytea`,
	}
}

// indexName names the expires_at index after the table (its last part: an
// index lives in its table's schema), cut to fit PostgreSQL's 63 bytes the
// way the server would not do silently.
func indexName(table string) string {
	name := table[strings.LastIndexByte(table, '.')+1:]
	const suffix = "_expires_at_idx"
	return name[:min(len(name), maxIdentifier-len(suffix))] + suffix
}

// qualifiedIndex is the index name as to_regclass must see it: in the
// table's schema when the table names one.
func qualifiedIndex(table string) string {
	idx := indexName(table)
	if i := strings.LastIndexByte(table, '.'); i >= 0 {
		return pgx.Identifier{table[:i], idx}.Sanitize()
	}
	return pgx.Identifier{idx}.Sanitize()
}

// ensureSchema creates the table on first use when CreateTable is set.
// Until that succeeds every operation tries again, so a store built while
// PostgreSQL was down starts working when it comes back; after that it
// costs an atomic load. Concurrent callers share one attempt and its
// result: with the server unreachable, queueing them for one attempt each
// would make the last wait for all the others' connect timeouts.
func (s *Store) ensureSchema(ctx context.Context) error {
	if !s.opts.CreateTable || s.schemaReady.Load() {
		return nil
	}
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	s.schemaMu.Lock()
	a := s.schemaAttempt
	leader := a == nil
	if leader {
		a = &attempt{done: make(chan struct{})}
		s.schemaAttempt = a
	}
	s.schemaMu.Unlock()

	if !leader {
		select {
		case <-a.done:
			return a.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := retry(ctx, func() error { return s.createSchema(ctx) }); err != nil {
		a.err = fmt.Errorf("creating table %s: %w", s.table, err)
	} else {
		s.schemaReady.Store(true)
	}
	s.schemaMu.Lock()
	s.schemaAttempt = nil
	s.schemaMu.Unlock()
	close(a.done)
	return a.err
}

// attempt is one run of the DDL that concurrent callers wait for; err is
// set before done is closed.
type attempt struct {
	done chan struct{}
	err  error
}

// createSchema runs the DDL in one transaction under an advisory lock.
// CREATE ... IF NOT EXISTS alone is not safe when several instances start
// at once: two sessions can both find the table missing and one then fails
// on the duplicate catalog row. The lock makes the second wait for the
// first and then find the table. When table and index exist already (the
// usual restart), no DDL runs at all: CREATE INDEX IF NOT EXISTS would
// still take a SHARE lock on a busy table before finding the index.
func (s *Store) createSchema(ctx context.Context) error {
	name := s.opts.Table
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, s.ddlLock); err != nil {
			return err
		}
		var exists bool
		err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL
	AND EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'detail' AND NOT attisdropped)`,
			s.table, qualifiedIndex(name)).Scan(&exists)
		if err != nil || exists {
			return err
		}
		for _, ddl := range schemaDDL(s.table, indexName(name)) {
			if _, err := tx.Exec(ctx, ddl); err != nil {
				return err
			}
		}
		return nil
	})
}

// Grant is the statement that lets role use table (the default table for
// ""): what a database user needs when it may not create tables
// (create_table off, the table made with Schema's statements).
func Grant(table, role string) (string, error) {
	if table == "" {
		table = DefaultTable
	}
	quoted, err := sanitizeTable(table)
	if err != nil {
		return "", err
	}
	if role == "" {
		return "", fmt.Errorf("postgres: grant: the role is empty")
	}
	return "GRANT SELECT, INSERT, UPDATE, DELETE ON " + quoted + " TO " + pgx.Identifier{role}.Sanitize(), nil
}
