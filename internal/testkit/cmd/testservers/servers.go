//go:build unix

package main

import (
	"fmt"
	"os"
	"strings"

	srv "github.com/caddy-idempotency/caddy-idempotency/internal/testkit/servers"
)

// The variables that name the servers, as internal/testkit/redistest and
// internal/testkit/pgtest read them.
const (
	envRedisURL    = "IDEMPOTENCY_REDIS_URL"
	envRedisAddr   = "IDEMPOTENCY_REDIS_ADDR" // older spelling: host:port
	envPostgresDSN = "IDEMPOTENCY_POSTGRES_DSN"
)

// dirPrefix starts the name of the temporary directory of a run.
const dirPrefix = "idempotency-testservers-"

// servers are the private servers of one run.
type servers struct {
	set   *srv.Set // nil until made
	env   []string // NAME=value for the command
	names []string // what was started, for the last log line
}

// wanted reports which servers the environment leaves to testservers.
func wanted(getenv func(string) string) (redis, postgres bool) {
	return getenv(envRedisURL) == "" && getenv(envRedisAddr) == "", getenv(envPostgresDSN) == ""
}

func (s *servers) start() error {
	needRedis, needPostgres := wanted(os.Getenv)
	if !needRedis {
		logf("Redis: using the server named by %s", firstSet(envRedisURL, envRedisAddr))
	}
	if !needPostgres {
		logf("PostgreSQL: using the server named by %s", envPostgresDSN)
	}
	if !needRedis && !needPostgres {
		return nil
	}
	bins, err := srv.Find(needRedis, needPostgres, logf)
	if err != nil {
		return fmt.Errorf("%w\n\nor set %s / %s to servers to use instead", err, envRedisURL, envPostgresDSN)
	}
	var pgUser *srv.Account
	if needPostgres {
		if pgUser, err = srv.ServerAccount(); err != nil {
			return err
		}
	}
	if s.set, err = srv.NewSet(dirPrefix, logf); err != nil {
		return err
	}
	logf("files in %s", s.set.Dir)
	if needRedis {
		// Without persistence: the tests want speed, and a restart that
		// forgets everything is a case they test on purpose.
		r, err := s.set.StartRedis(bins.Redis, srv.RedisOptions{})
		if err != nil {
			return err
		}
		s.env = append(s.env, envRedisURL+"="+r.URL(), envRedisAddr+"="+r.Addr)
		s.names = append(s.names, "redis-server")
		logf("redis-server %s on %s: %s=%s", srv.RedisVersion(bins.Redis), r.Addr, envRedisURL, r.URL())
	}
	if needPostgres {
		p, err := s.set.StartPostgres(bins, pgUser)
		if err != nil {
			return err
		}
		s.env = append(s.env, envPostgresDSN+"="+p.DSN)
		s.names = append(s.names, "PostgreSQL")
		logf("PostgreSQL %s on %s, running as user %s: %s=%s", p.Version, p.Addr, pgUser.Name, envPostgresDSN, p.DSN)
	}
	return nil
}

func firstSet(names ...string) string {
	for _, n := range names {
		if os.Getenv(n) != "" {
			return n
		}
	}
	return ""
}

// stop stops the servers, makes sure nothing runs in the directory any
// more, and removes it.
func (s *servers) stop() error {
	if s.set == nil {
		return nil
	}
	if err := s.set.Close(); err != nil {
		return err
	}
	if len(s.names) > 0 {
		logf("stopped %s; removed %s", strings.Join(s.names, " and "), s.set.Dir)
	}
	return nil
}
