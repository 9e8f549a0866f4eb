#!/usr/bin/env bash
# Makes sure the Redis and PostgreSQL servers the tests talk to are running
# on loopback: starts them when they are installed but stopped, and installs
# them with apt-get when they are missing. Idempotent; safe to run often.
#
#   IDEMPOTENCY_REDIS_ADDR     default 127.0.0.1:6379
#   IDEMPOTENCY_POSTGRES_DSN   default postgres://postgres@127.0.0.1:5432/test?sslmode=disable
set -euo pipefail

log() { echo "services: $*" >&2; }

as_root() {
	if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
		log "need root for: $*"; return 1
	fi
}

apt_install() {
	log "installing $*"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

wait_for() { # wait_for <what> <command...>
	local what=$1; shift
	for _ in $(seq 1 50); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		sleep 0.2
	done
	log "$what did not come up"; return 1
}

redis_addr=${IDEMPOTENCY_REDIS_ADDR:-127.0.0.1:6379}
redis_host=${redis_addr%:*}
redis_port=${redis_addr##*:}

redis_up() { redis-cli -h "$redis_host" -p "$redis_port" ping | grep -q PONG; }

ensure_redis() {
	command -v redis-server >/dev/null && command -v redis-cli >/dev/null || apt_install redis-server redis-tools
	if redis_up 2>/dev/null; then return 0; fi
	log "starting redis-server on $redis_addr"
	as_root mkdir -p /var/lib/redis /var/log/redis
	as_root redis-server --daemonize yes --bind "$redis_host" --port "$redis_port" \
		--save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
	wait_for "redis on $redis_addr" redis_up
}

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432; }

psql_admin() { # runs SQL as the postgres superuser over the local socket
	as_root runuser -u postgres -- psql -qAtX -v ON_ERROR_STOP=1 "$@"
}

ensure_postgres() {
	if ! command -v pg_ctlcluster >/dev/null; then
		apt_install postgresql postgresql-client
	fi
	if ! pg_up; then
		log "starting PostgreSQL"
		local version
		version=$(ls /etc/postgresql | sort -V | tail -n1)
		as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
		wait_for "postgresql on 127.0.0.1:5432" pg_up
	fi
	# The tests connect as postgres over TCP without a password.
	if ! psql -h 127.0.0.1 -U postgres -d postgres -qAtX -c 'select 1' >/dev/null 2>&1; then
		log "allowing trust auth for postgres on loopback (test machine only)"
		local hba
		hba=$(psql_admin -c 'show hba_file')
		as_root sed -i '1i host all postgres 127.0.0.1/32 trust\nhost all postgres ::1/128 trust' "$hba"
		psql_admin -c 'select pg_reload_conf()' >/dev/null
		sleep 0.5
	fi
	if [ "$(psql -h 127.0.0.1 -U postgres -d postgres -qAtX -c "select 1 from pg_database where datname = 'test'")" != 1 ]; then
		log "creating database test"
		psql -h 127.0.0.1 -U postgres -d postgres -qAtX -c 'create database test'
	fi
}

# With a custom DSN the caller owns the server; only the default is managed.
ensure_redis
if [ -z "${IDEMPOTENCY_POSTGRES_DSN:-}" ]; then
	ensure_postgres
fi
log "redis and postgresql are up"
