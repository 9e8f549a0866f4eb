package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/pgtest"
	"github.com/caddy-idempotency/caddy-idempotency/internal/testkit/testutil"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	pgstore "github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// runCommand runs cmd with args and returns what it printed.
var runCommand = testutil.RunCommand

// TestSchemaCommandMakesATableAStoreWorksOn runs the statements `caddy
// idempotency schema --table t --role r` prints on a real PostgreSQL: a
// role that may not create tables then runs a store on the table.
func TestSchemaCommandMakesATableAStoreWorksOn(t *testing.T) {
	dsn := pgtest.Require(t)
	table := pgtest.Table(t, dsn)
	roleDSN, role := pgtest.Role(t, dsn, "")
	out, err := runCommand(t, schemaCommand(), "--table", table, "--role", role)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "CREATE TABLE IF NOT EXISTS") || !strings.Contains(out, "GRANT SELECT, INSERT, UPDATE, DELETE") {
		t.Fatalf("schema printed %q", out)
	}
	for _, stmt := range strings.Split(out, ";\n") {
		if stmt = strings.TrimSpace(stmt); stmt != "" {
			pgtest.Exec(t, dsn, stmt)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	poolCfg, err := pgstore.NewPoolConfig(roleDSN, 2)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := pgstore.New(pool, pgstore.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	key := storage.Key{Scope: "s", ID: "schema"}
	res, err := s.Reserve(ctx, key, []byte("fp"), time.Minute)
	if err != nil || res.Outcome != storage.Acquired {
		t.Fatalf("reserve as %s on the table the schema made: %v %v", role, res.Outcome, err)
	}
	if err := s.Complete(ctx, key, res.Token, &storage.Response{Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}

	if out, err := runCommand(t, schemaCommand(), "--table", "Bad-Name"); err == nil {
		t.Fatalf("schema for an invalid table name: %q, want an error", out)
	}
}

// TestSchemaCommandMarksItsUpgradeStatements: the statements that bring
// a table of an earlier version up to date (ALTER TABLE ... ADD COLUMN IF
// NOT EXISTS) come with a comment that says so; those that make the table
// do not.
func TestSchemaCommandMarksItsUpgradeStatements(t *testing.T) {
	out, err := runCommand(t, schemaCommand())
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out, "\n")
	upgrades := 0
	for i, line := range lines {
		marked := i > 0 && strings.HasPrefix(lines[i-1], "-- Upgrade:")
		switch {
		case strings.Contains(line, "ADD COLUMN IF NOT EXISTS"):
			upgrades++
			if !marked {
				t.Errorf("upgrade statement %q without its comment in:\n%s", line, out)
			}
		case strings.HasPrefix(line, "CREATE ") && marked:
			t.Errorf("%q marked as an upgrade", line)
		}
	}
	if upgrades == 0 {
		t.Fatalf("no upgrade statement in:\n%s", out)
	}
}
