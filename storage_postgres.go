package idempotency

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
	"github.com/caddy-idempotency/caddy-idempotency/storage/cache"
	"github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

func init() {
	caddy.RegisterModule(PostgresStorage{})
}

// defaultPostgresTimeout bounds each statement on the request path.
const defaultPostgresTimeout = 2 * time.Second

// PostgresStorage keeps idempotency records in a PostgreSQL table, shared
// by every Caddy instance using the same database. A new key costs two
// statements and a replay one; expired rows are deleted periodically by
// one instance at a time.
//
// Caddy starts and reloads while PostgreSQL is down: nothing connects at
// start-up, the table is created on first use, and until the database
// answers requests follow on_storage_error. Handlers with the same
// configuration share one connection pool, kept across config reloads.
type PostgresStorage struct {
	// The connection string: a URL (postgres://user:pass@host:5432/db?sslmode=verify-full)
	// or keyword/value pairs (host=... user=... dbname=...), with any
	// parameter pgx accepts (pool_* parameters too). Placeholders such as
	// {env.PG_DSN} or {env.PG_PASSWORD} are resolved at provision time and
	// never written back, so secrets stay out of the config Caddy serves.
	// When it sets no connect_timeout, connecting gives up after 5s.
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
	// bounds the table's size. Default: 5m.
	CleanupInterval caddy.Duration `json:"cleanup_interval,omitempty"`

	// The most connections this configuration opens to the database, on
	// every instance. Default: pgx's, the greater of 4 and the number of
	// CPUs (or the DSN's pool_max_conns).
	MaxConns int `json:"max_conns,omitempty"`

	// How long one statement on the request path may take, waiting for a
	// pooled connection included, before the request gets the
	// on_storage_error treatment: a table locked by a migration or a
	// network partition then costs requests this long at most. A
	// statement that runs out of time is cancelled on the server too.
	// Default: 2s.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// Keep completed records in this process too, so that replays skip
	// the database. Off by default.
	ReplayCache *ReplayCache `json:"replay_cache,omitempty"`

	store   storage.Store
	poolKey string
}

// postgresConfig is what names a pool: the resolved configuration. It is
// only ever hashed (storeKey), so the resolved DSN never leaves memory.
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
func (PostgresStorage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.idempotency.storage.postgres",
		New: func() caddy.Module { return new(PostgresStorage) },
	}
}

// Provision resolves the DSN, fills in defaults and takes the shared store
// for this configuration, building its pool on first use. It never
// connects, so PostgreSQL being down does not fail it.
func (p *PostgresStorage) Provision(caddy.Context) error {
	if p.Table == "" {
		p.Table = postgres.DefaultTable
	}
	if p.CreateTable == nil {
		yes := true
		p.CreateTable = &yes
	}
	if p.CleanupInterval == 0 {
		p.CleanupInterval = caddy.Duration(postgres.DefaultCleanupInterval)
	}
	if p.Timeout == 0 {
		p.Timeout = caddy.Duration(defaultPostgresTimeout)
	}
	if err := p.validate(); err != nil {
		return err
	}
	// ReplaceKnown, not ReplaceAll: a password may contain braces that are
	// not a placeholder.
	dsn := caddy.NewReplacer().ReplaceKnown(p.DSN, "")
	if strings.TrimSpace(dsn) == "" {
		return errors.New("postgres storage: dsn is empty once placeholders are resolved")
	}
	cfg, err := postgres.NewPoolConfig(dsn, p.MaxConns)
	if err != nil {
		return fmt.Errorf("postgres storage: %w", err)
	}
	opts := postgres.Options{
		Table:           p.Table,
		CreateTable:     *p.CreateTable,
		CleanupInterval: time.Duration(p.CleanupInterval),
		Timeout:         time.Duration(p.Timeout),
		OnCleanup:       logCleanup(p.Table),
	}
	key, err := storeKey("postgres", postgresConfig{dsn, p.Table, *p.CreateTable, time.Duration(p.CleanupInterval), p.MaxConns, time.Duration(p.Timeout), p.ReplayCache.config()})
	if err != nil {
		return err
	}
	store, err := acquireStore("postgres", key, func() (storage.Store, error) {
		// No connection is made here: pgxpool connects on first use.
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			return nil, fmt.Errorf("postgres storage: %w", err)
		}
		s, err := postgres.New(pool, opts)
		if err != nil {
			pool.Close()
			return nil, err
		}
		return wrapCache(s, p.ReplayCache.config()), nil
	})
	if err != nil {
		return err
	}
	p.store, p.poolKey = store, key
	return nil
}

// validate checks the settings that need no resolving.
func (p *PostgresStorage) validate() error {
	switch {
	case p.DSN == "":
		return errors.New("postgres storage: dsn is required")
	case p.CleanupInterval < 0:
		return fmt.Errorf("postgres storage: cleanup_interval must be positive, got %s", time.Duration(p.CleanupInterval))
	case p.MaxConns < 0 || p.MaxConns > math.MaxInt32:
		return fmt.Errorf("postgres storage: max_conns must be a positive number, got %d", p.MaxConns)
	case p.Timeout < 0:
		return fmt.Errorf("postgres storage: timeout must be positive, got %s", time.Duration(p.Timeout))
	case p.ReplayCache.validate() != nil:
		return fmt.Errorf("postgres storage: %w", p.ReplayCache.validate())
	}
	if _, err := postgres.Schema(p.Table); err != nil {
		return fmt.Errorf("postgres storage: %w", err)
	}
	return nil
}

// logCleanup reports the periodic cleanups of a pool. The pool outlives
// the config that made it, so it logs through Caddy's default logger
// rather than that config's.
func logCleanup(table string) func(int64, error) {
	return func(deleted int64, err error) {
		log := caddy.Log().Named("http.idempotency.storage.postgres")
		switch {
		case errors.Is(err, postgres.ErrCleanupLocked):
			// Another instance is cleaning: nothing to report.
		case err != nil:
			log.Warn("deleting expired idempotency records", zap.String("table", table), zap.Int64("deleted", deleted), zap.Error(err))
		case deleted > 0:
			log.Debug("deleted expired idempotency records", zap.String("table", table), zap.Int64("deleted", deleted))
		}
	}
}

// Store implements StorageBackend.
func (p *PostgresStorage) Store() storage.Store { return p.store }

// Cleanup drops this handler's reference to the shared store; the last one
// closes its pool. It tolerates a half-provisioned module.
func (p *PostgresStorage) Cleanup() error {
	if p.poolKey == "" {
		return nil
	}
	key := p.poolKey
	p.poolKey, p.store = "", nil
	return releaseStore(key)
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
func (p *PostgresStorage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume the backend name
	if d.NextArg() {
		return d.ArgErr()
	}
	return eachOption(d, "postgres storage: ", nil, func(opt string) error {
		var err error
		switch opt {
		case "dsn":
			err = stringArg(d, &p.DSN)
		case "table":
			if err = stringArg(d, &p.Table); err == nil {
				if _, verr := postgres.Schema(p.Table); verr != nil {
					err = d.Errf("table: %v", verr)
				}
			}
		case "create_table":
			var v string
			if err = oneOfArg(d, &v, "true", "false"); err == nil {
				b := v == "true"
				p.CreateTable = &b
			}
		case "cleanup_interval":
			err = durationArg(d, &p.CleanupInterval)
		case "max_conns":
			p.MaxConns, err = intArg(d)
		case "timeout":
			err = durationArg(d, &p.Timeout)
		case "replay_cache":
			p.ReplayCache, err = parseReplayCache(d)
		default:
			return d.Errf("unrecognized postgres storage option '%s'", opt)
		}
		return err
	})
}

// Interface guards
var (
	_ caddy.Provisioner     = (*PostgresStorage)(nil)
	_ caddy.CleanerUpper    = (*PostgresStorage)(nil)
	_ caddyfile.Unmarshaler = (*PostgresStorage)(nil)
	_ StorageBackend        = (*PostgresStorage)(nil)
)
