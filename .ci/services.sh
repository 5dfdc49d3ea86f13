#!/usr/bin/env bash
# Real PostgreSQL and Redis servers on loopback, for tests, CI and local development.
#
#   source .ci/services.sh && tinyctx_services_start   # exports the URLs below
#   ... run the tests ...
#   tinyctx_services_stop                              # stops both, removes the temp dir
#
# or, from another program (the tests' session fixture does this):
#   bash .ci/services.sh start [--no-install]   # prints KEY=VALUE lines
#   bash .ci/services.sh stop DIR               # DIR is the printed TINYCTX_SERVICES_DIR
#
# Exports / prints:
#   TINYCTX_TEST_POSTGRES_URL  postgresql://postgres@127.0.0.1:PORT/postgres
#   TINYCTX_TEST_REDIS_URL     redis://127.0.0.1:PORT/0
#   TINYCTX_SERVICES_DIR       the temporary directory holding both servers' data and logs
#
# Missing servers are installed from Debian's packages (`postgresql`, `redis-server`) when
# running as root, unless --no-install. PostgreSQL refuses to run as root, so as root it
# runs as the `postgres` user. Both listen on 127.0.0.1 only, on ports picked at start,
# with durability switched off (fsync off, no Redis persistence): these are test servers.

_tinyctx_pg_bindir() {
    local found
    found="$(command -v pg_ctl 2>/dev/null || true)"
    if [[ -n "$found" ]]; then
        dirname "$(readlink -f "$found")"
        return 0
    fi
    found="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    if [[ -n "$found" && -x "$found/pg_ctl" ]]; then
        echo "$found"
        return 0
    fi
    return 1
}

_tinyctx_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# run a command as the postgres user when we are root (PostgreSQL refuses root)
_tinyctx_as_pg() {
    if [[ "$(id -u)" == 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

_tinyctx_install_missing() {
    local need=()
    _tinyctx_pg_bindir >/dev/null || need+=(postgresql)
    command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
    if ((${#need[@]} == 0)); then
        return 0
    fi
    if [[ "$(id -u)" != 0 ]]; then
        echo "services: missing ${need[*]}; install them (apt-get install ${need[*]}) or run as root" >&2
        return 1
    fi
    echo "services: installing ${need[*]} from Debian's packages" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" \
        </dev/null >&2
}

_tinyctx_start_postgres() {
    local dir="$1" bindir port
    bindir="$(_tinyctx_pg_bindir)" || {
        echo "services: PostgreSQL (pg_ctl, initdb) not found" >&2
        return 1
    }
    mkdir -p "$dir/pg"
    if [[ "$(id -u)" == 0 ]]; then
        chown postgres: "$dir/pg"
    fi
    _tinyctx_as_pg "$bindir/initdb" -D "$dir/pg/data" -U postgres -A trust -E UTF8 \
        --no-sync >"$dir/pg/initdb.log" 2>&1 || {
        cat "$dir/pg/initdb.log" >&2
        return 1
    }
    local tries
    for tries in 1 2 3; do
        port="$(_tinyctx_free_port)"
        if _tinyctx_as_pg "$bindir/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/server.log" -w -t 60 \
            -o "-c listen_addresses=127.0.0.1 -p $port -k $dir/pg -c fsync=off \
                -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
            start >/dev/null 2>&1; then
            TINYCTX_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:$port/postgres"
            return 0
        fi
    done
    echo "services: PostgreSQL did not start; its log:" >&2
    cat "$dir/pg/server.log" >&2
    return 1
}

_tinyctx_start_redis() {
    local dir="$1" port tries waited
    command -v redis-server >/dev/null 2>&1 || {
        echo "services: redis-server not found" >&2
        return 1
    }
    mkdir -p "$dir/redis"
    for tries in 1 2 3; do
        port="$(_tinyctx_free_port)"
        redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
            --daemonize yes --pidfile "$dir/redis/redis.pid" --logfile "$dir/redis/server.log" \
            --dir "$dir/redis" >/dev/null 2>&1 || continue
        for waited in $(seq 1 100); do
            if python3 - "$port" <<'PY' 2>/dev/null; then
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1) as s:
    s.sendall(b"PING\r\n")
    sys.exit(0 if s.recv(16).startswith(b"+PONG") else 1)
PY
                TINYCTX_TEST_REDIS_URL="redis://127.0.0.1:$port/0"
                return 0
            fi
            sleep 0.1
        done
        [[ -f "$dir/redis/redis.pid" ]] && kill "$(cat "$dir/redis/redis.pid")" 2>/dev/null
    done
    echo "services: redis-server did not start; its log:" >&2
    cat "$dir/redis/server.log" >&2 2>/dev/null
    return 1
}

# stop both servers found in DIR (or $TINYCTX_SERVICES_DIR) and remove DIR; never fails
tinyctx_services_stop() {
    local dir="${1:-${TINYCTX_SERVICES_DIR:-}}" bindir pid waited
    [[ -n "$dir" && -d "$dir" ]] || return 0
    if [[ -f "$dir/pg/data/postmaster.pid" ]] && bindir="$(_tinyctx_pg_bindir)"; then
        _tinyctx_as_pg "$bindir/pg_ctl" -D "$dir/pg/data" -m immediate -w -t 30 stop \
            >/dev/null 2>&1 || true
    fi
    if [[ -f "$dir/redis/redis.pid" ]]; then
        pid="$(cat "$dir/redis/redis.pid")"
        kill "$pid" 2>/dev/null || true
        for waited in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -rf "$dir"
    if [[ "${TINYCTX_SERVICES_DIR:-}" == "$dir" ]]; then
        unset TINYCTX_SERVICES_DIR TINYCTX_TEST_POSTGRES_URL TINYCTX_TEST_REDIS_URL
    fi
    return 0
}

# start both servers in a new temp dir and export their URLs; --no-install never installs
tinyctx_services_start() {
    local install=1 dir
    [[ "${1:-}" == "--no-install" ]] && install=0
    if ((install)); then
        _tinyctx_install_missing || return 1
    fi
    dir="$(mktemp -d "${TMPDIR:-/tmp}/tinyctx-services.XXXXXX")" || return 1
    chmod 755 "$dir" # the postgres user must reach its data dir inside
    if ! _tinyctx_start_postgres "$dir" || ! _tinyctx_start_redis "$dir"; then
        tinyctx_services_stop "$dir"
        return 1
    fi
    export TINYCTX_SERVICES_DIR="$dir" TINYCTX_TEST_POSTGRES_URL TINYCTX_TEST_REDIS_URL
    echo "services: PostgreSQL at $TINYCTX_TEST_POSTGRES_URL, Redis at $TINYCTX_TEST_REDIS_URL" >&2
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    set -uo pipefail
    case "${1:-}" in
    start)
        tinyctx_services_start "${2:-}" || exit 1
        echo "TINYCTX_SERVICES_DIR=$TINYCTX_SERVICES_DIR"
        echo "TINYCTX_TEST_POSTGRES_URL=$TINYCTX_TEST_POSTGRES_URL"
        echo "TINYCTX_TEST_REDIS_URL=$TINYCTX_TEST_REDIS_URL"
        ;;
    stop)
        tinyctx_services_stop "${2:?usage: services.sh stop DIR}"
        ;;
    *)
        echo "usage: $0 start [--no-install] | stop DIR   (or source it: see the header)" >&2
        exit 2
        ;;
    esac
fi
