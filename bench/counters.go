package main

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"
)

// counter reads a store's cumulative count of client round trips.
type counter interface {
	read(ctx context.Context) (int64, error)
}

// redisScripts counts EVALSHA and EVAL calls (INFO commandstats): every
// store operation is one script call, while the commands a script runs
// inside Redis are counted under their own names and are not round trips.
type redisScripts struct{ client *goredis.Client }

func (c redisScripts) read(ctx context.Context) (int64, error) {
	info, err := c.client.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var total int64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, err
				}
				total += n
			}
		}
	}
	return total, nil
}

// postgresCommits counts committed transactions of one database
// (pg_stat_database.xact_commit): every store statement runs in its own
// transaction. The reading session flushes its own statistics first and
// its own commits are subtracted by the caller's delta of two readings.
type postgresCommits struct {
	dsn, database string
}

func (c postgresCommits) read(ctx context.Context) (int64, error) {
	conn, err := pgx.Connect(ctx, c.dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var n int64
	err = conn.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = $1`, c.database).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("reading xact_commit: %w", err)
	}
	return n, nil
}
