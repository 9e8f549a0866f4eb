package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/backend/cfargs"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/cache"
	"github.com/caddy-idempotency/caddy-idempotency/storage/opterr"
	pgstore "github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
	"github.com/caddy-idempotency/caddy-idempotency/storage/redact"
)

// name is the backend's name: storage postgres.
const name backend.Name = "postgres"

func init() {
	caddy.RegisterModule(Storage{})
}

// defaultPostgresTimeout bounds each operation on the request path.
const defaultPostgresTimeout = 2 * time.Second

// The range of each duration option: a JSON number is nanoseconds, so
// "timeout": 2 means 2ns (every request would time out), and a value
// near the int64 maximum is a typo rather than a plan.
const (
	// A statement takes about a millisecond on a local network; less
	// than this would fail healthy requests. More than this keeps a
	// request waiting on a sick database longer than any client does.
	minPostgresTimeout = 10 * time.Millisecond
	maxPostgresTimeout = time.Minute
	// Cleanup more often than this only burns the advisory lock; less
	// often than this lets the table grow by a month of expired rows.
	minCleanupInterval = time.Second
	maxCleanupInterval = 30 * 24 * time.Hour
)

// Storage keeps idempotency records in a PostgreSQL table, shared
// by every Caddy instance using the same database. A new key costs two
// statements and a replay one; expired rows are deleted periodically by
// one instance at a time.
//
// Caddy starts and reloads while PostgreSQL is down: nothing connects at
// start-up, the table is created on first use, and until the database
// answers requests follow on_storage_error. Handlers with the same
// configuration share one connection pool, kept across config reloads.
type Storage struct {
	// The connection string: a URL (postgres://user:pass@host:5432/db?sslmode=verify-full)
	// or keyword/value pairs (host=... user=... dbname=...), with any
	// parameter pgx accepts (pool_* parameters too). Placeholders such as
	// {env.PG_DSN} or {env.PG_PASSWORD} are resolved at provision time and
	// never written back, so secrets stay out of the config Caddy serves.
	// When it sets no connect_timeout, connecting gives up after 5s.
	// Its pool, size and timeout parameters are checked against what pgx
	// and the module accept (docs/storage-postgres.md).
	// Pool connections use TCP keepalive, so that a peer that vanished
	// is noticed within about 30s.
	// Required.
	DSN string `json:"dsn,omitempty"`

	// The table holding the records: name or schema.name, lower-case
	// letters, digits and underscores. Default: idempotency_keys.
	Table string `json:"table,omitempty"`

	// Create the table and its index on first use if they do not exist
	// (safe when several instances start at once). Set false when the
	// database user may not create tables; see the README for the DDL.
	// Default: true.
	CreateTable *bool `json:"create_table,omitempty"`

	// How often expired rows are deleted. Every instance tries; an
	// advisory lock lets one at a time do it, in batches of 1000 rows.
	// Expired records are never replayed, whenever cleanup runs: this only
	// bounds the table's size. Between 1s and 30d. Default: 5m.
	CleanupInterval caddy.Duration `json:"cleanup_interval,omitempty"`

	// The most connections this configuration opens to the database, on
	// every instance, for reserves, completions and releases (1 to 10000); lease
	// renewals have two more of their own, so that a burst of requests
	// never delays them. A request holds one only while a statement runs.
	// Default: the DSN's pool_max_conns, else the greater of 16 and twice
	// the number of CPUs (pgx's own default of 4 on a small machine let
	// only four new keys reserve at a time).
	MaxConns int `json:"max_conns,omitempty"`

	// How long one operation on the request path may take, waiting for a
	// pooled connection included, before the request gets the
	// on_storage_error treatment: a table locked by a migration or a
	// network partition then costs requests this long at most. A
	// statement that runs out of time is cancelled on the server too.
	// A wait for one row that another transaction holds ends sooner, at a
	// quarter of it (between 50ms and 500ms), and refuses that key's
	// request alone, whatever on_storage_error says. Admin lookups by
	// key_hash (a scan of the table) get ten times as long. Between 10ms
	// and 1m. Default: 2s.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// Keep completed records in this process too, so that replays skip
	// the database. Off by default.
	ReplayCache *backend.ReplayCache `json:"replay_cache,omitempty"`

	backend.Pooled
}

// postgresConfig is what names a pool: the resolved configuration. It is
// only ever hashed, so the resolved DSN never leaves memory.
type postgresConfig struct {
	DSN             string         `json:"dsn"`
	Table           string         `json:"table"`
	CreateTable     bool           `json:"create_table"`
	CleanupInterval time.Duration  `json:"cleanup_interval"`
	MaxConns        int            `json:"max_conns"`
	Timeout         time.Duration  `json:"timeout"`
	Cache           *cache.Options `json:"cache,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Storage) CaddyModule() caddy.ModuleInfo {
	return name.ModuleInfo(func() caddy.Module { return new(Storage) })
}

// Provision compiles the configuration, resolves the DSN's placeholders
// and takes the shared store for the result, building its pool on first
// use. It never connects, so PostgreSQL being down does not fail it.
func (p *Storage) Provision(ctx caddy.Context) error {
	cfg, err := p.compile()
	if err != nil {
		return err
	}
	// ReplaceKnown, not ReplaceAll: a password may contain braces that
	// are not a placeholder.
	cfg.DSN = caddy.NewReplacer().ReplaceKnown(cfg.DSN, "")
	if strings.TrimSpace(cfg.DSN) == "" {
		return name.Errorf("dsn is empty once placeholders are resolved")
	}
	poolCfg, err := pgstore.NewPoolConfig(cfg.DSN, cfg.MaxConns)
	if err != nil {
		return name.Errorf("%w", err)
	}
	cc := poolCfg.ConnConfig
	where := fmt.Sprintf("postgres://%s@%s/%s table %s (max_conns %d)", cc.User, net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))), cc.Database, cfg.Table, poolCfg.MaxConns)
	// A DSN pgx misread may put a password anywhere.
	where = redact.Scrub(where, append(redact.Secrets(cfg.DSN), cc.Password))
	backend.CountRemoved(name, backend.RemovedExpired, 0) // the series exists, at zero, once a store is configured
	id, err := backend.StoreID(name, cfg)
	if err != nil {
		return err
	}
	notReplicated := &backend.DurabilityLog{Logger: ctx.Logger(), Backend: name, Store: id,
		Message: "PostgreSQL cancelled idempotency commits' waits for a synchronous standby (the storage's timeout): committed on the primary alone; " +
			"reservations fail as store errors (on_storage_error), completions are sent again until the standby has them"}
	return p.Acquire(ctx.Logger(), name, cfg, where, func() (storage.Store, error) {
		// No connection is made here: pgxpool connects on first use.
		pool, err := pgxpool.NewWithConfig(context.Background(), poolCfg)
		if err != nil {
			return nil, name.Errorf("%w", err)
		}
		s, err := pgstore.New(pool, pgstore.Options{
			Table:           cfg.Table,
			CreateTable:     cfg.CreateTable,
			CleanupInterval: cfg.CleanupInterval,
			Timeout:         cfg.Timeout,
			OnCleanup:       logCleanup(cfg.Table),
			OnNotReplicated: func(op string) { notReplicated.Add(op, 0) },
		})
		if err != nil {
			pool.Close()
			return nil, err
		}
		return backend.Wrap(s, cfg.Cache), nil
	})
}

// Validate reports configuration errors: none once provisioned (Provision
// compiles the configuration first), else the compile error.
func (p *Storage) Validate() error {
	return backend.Validate(p, p.compile)
}

// compile checks the configuration and returns it with defaults filled
// in and the DSN as written (Provision resolves its placeholders). It
// touches no network; a DSN without placeholders is parsed and its
// parameters checked here (pgx reads the PG* environment and the passfile
// as it parses), so that a Caddyfile error points at the dsn's line. An
// error names its option (opterr). The required dsn is checked
// last, so that a Caddyfile block without one still has its values
// checked.
func (p *Storage) compile() (postgresConfig, error) {
	if p.MaxConns < 0 || p.MaxConns > pgstore.MaxConns {
		return postgresConfig{}, name.OptionErrorf("max_conns", "max_conns must be from 1 to %d, got %d", pgstore.MaxConns, p.MaxConns)
	}
	if err := backend.CheckDuration("cleanup_interval", p.CleanupInterval, caddy.Duration(minCleanupInterval), caddy.Duration(maxCleanupInterval)); err != nil {
		return postgresConfig{}, name.OptionErrorf("cleanup_interval", "%w", err)
	}
	if err := backend.CheckDuration("timeout", p.Timeout, caddy.Duration(minPostgresTimeout), caddy.Duration(maxPostgresTimeout)); err != nil {
		return postgresConfig{}, name.OptionErrorf("timeout", "%w", err)
	}
	if p.Table != "" {
		if _, err := pgstore.Schema(p.Table); err != nil {
			return postgresConfig{}, name.OptionErrorf("table", "%w", err)
		}
	}
	if err := p.ReplayCache.Check(name); err != nil {
		return postgresConfig{}, err
	}
	if p.DSN == "" {
		return postgresConfig{}, opterr.Missing("dsn", name.Errorf("dsn is required"))
	}
	if !strings.Contains(p.DSN, "{") {
		// Its parameters are checked here, where a Caddyfile error can
		// point at the dsn's line; one with placeholders is checked
		// once they are resolved, by Provision.
		if _, err := pgstore.NewPoolConfig(p.DSN, p.MaxConns); err != nil {
			return postgresConfig{}, name.Errorf("%w", err)
		}
	}
	return postgresConfig{
		DSN:             p.DSN,
		Table:           cmp.Or(p.Table, pgstore.DefaultTable),
		CreateTable:     p.CreateTable == nil || *p.CreateTable,
		CleanupInterval: cmp.Or(time.Duration(p.CleanupInterval), pgstore.DefaultCleanupInterval),
		MaxConns:        p.MaxConns,
		Timeout:         cmp.Or(time.Duration(p.Timeout), defaultPostgresTimeout),
		Cache:           p.ReplayCache.Options(),
	}, nil
}

// logCleanup reports the periodic cleanups of a pool, and counts the rows
// they deleted in caddy_http_idempotency_records_removed_total. The pool
// outlives the config that made it, so it logs through Caddy's default
// logger rather than that config's.
func logCleanup(table string) func(int64, error) {
	return func(deleted int64, err error) {
		// A run that failed half-way deleted its first batches all the same.
		backend.CountRemoved(name, backend.RemovedExpired, deleted)
		log := caddy.Log().Named("http.idempotency.storage.postgres")
		switch {
		case errors.Is(err, pgstore.ErrCleanupLocked):
			// Another instance is cleaning: nothing to report.
		case err != nil:
			log.Warn("deleting expired idempotency records", zap.String("table", table), zap.Int64("deleted", deleted), zap.Error(err))
		case deleted > 0:
			log.Debug("deleted expired idempotency records", zap.String("table", table), zap.Int64("deleted", deleted))
		}
	}
}

// UnmarshalCaddyfile parses
//
//	storage postgres {
//	    dsn <dsn>
//	    table <name>
//	    create_table true|false
//	    cleanup_interval <duration>
//	    max_conns <n>
//	    timeout <duration>
//	    replay_cache <max_entries> [<ttl>]
//	}
func (p *Storage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume the backend name
	if err := cfargs.NoArgs(d); err != nil {
		return err
	}
	return backend.UnmarshalBlock(d, name, nil, func(opt string) error {
		var err error
		switch opt {
		case "dsn":
			return cfargs.StringArg(d, &p.DSN)
		case "table":
			return cfargs.StringArg(d, &p.Table)
		case "create_table":
			return cfargs.BoolArg(d, &p.CreateTable)
		case "cleanup_interval":
			return cfargs.DurationArg(d, &p.CleanupInterval)
		case "max_conns":
			return cfargs.IntArg(d, &p.MaxConns)
		case "timeout":
			return cfargs.DurationArg(d, &p.Timeout)
		case "replay_cache":
			p.ReplayCache, err = backend.ParseReplayCache(d)
			return err
		}
		return name.Unknown(d, opt, options)
	}, p.compile)
}

// options are the options of the storage postgres block.
var options = []string{"dsn", "table", "create_table", "cleanup_interval", "max_conns", "timeout", "replay_cache"}

// Interface guards
var (
	_ caddy.Provisioner     = (*Storage)(nil)
	_ caddy.Validator       = (*Storage)(nil)
	_ caddyfile.Unmarshaler = (*Storage)(nil)
	_ backend.Backend       = (*Storage)(nil)
)

// UnmarshalJSON decodes the storage's JSON config as Caddy would, but
// that an error names the option whose value does not decode
// (backend.DecodeJSON).
func (s *Storage) UnmarshalJSON(b []byte) error {
	type fields Storage
	return backend.DecodeJSON(b, (*fields)(s))
}
