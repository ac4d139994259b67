#!/usr/bin/env bash
# Start/stop a tansu (Kafka-compatible) broker with SQLite state.
#
#   scripts/tansu.sh start PORT DIR [LOG]  start a broker on 127.0.0.1:PORT, state in
#                                          DIR/tansu.db, log to LOG (default DIR/tansu.log);
#                                          prints the broker's pid on stdout once it
#                                          accepts connections
#   scripts/tansu.sh stop PID              stop that broker (SIGTERM, then SIGKILL after 10 s)
#   scripts/tansu.sh index DIR             add the fetch index to DIR/tansu.db
#
# The test suite uses this for private brokers; scripts/deps.sh uses it for the
# shared one on 127.0.0.1:9092. Progress messages go to stderr, so
# `pid=$(scripts/tansu.sh start 19092 "$tmp")` captures only the pid.
set -euo pipefail

export PATH="$PATH:${HOME:-/root}/.cargo/bin"
TANSU_READY_TIMEOUT="${TANSU_READY_TIMEOUT:-30}"

die() { echo "tansu.sh: $*" >&2; exit 1; }

port_open() { timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# tansu (0.6.0) creates its whole schema, `header` included, when the broker
# starts, so the index can be added as soon as the port accepts connections.
# Without it every fetch scans `header` (about 300x slower once topics hold data).
# Returns 2 when the database or its `header` table does not exist yet.
add_index() {
    local db="$1/tansu.db"
    [[ -f $db ]] || return 2
    local has
    has=$(sqlite3 -cmd '.timeout 10000' "$db" \
        "select count(*) from sqlite_master where type = 'table' and name = 'header'") || return 1
    [[ $has == 1 ]] || return 2
    sqlite3 -cmd '.timeout 10000' "$db" \
        'create index if not exists header_topition_offset on header(topition, offset_id);' >/dev/null
}

start() {
    [[ $# -ge 2 ]] || die "usage: start PORT DIR [LOG]"
    local port="$1" dir="$2" log="${3:-}"
    [[ $port =~ ^[0-9]+$ ]] || die "bad port: $port"
    command -v tansu >/dev/null || die "tansu not found in PATH or ~/.cargo/bin (run scripts/deps.sh)"
    command -v sqlite3 >/dev/null || die "sqlite3 not found (run scripts/deps.sh)"
    port_open "$port" && die "127.0.0.1:$port is already in use"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    log="${log:-$dir/tansu.log}"
    mkdir -p "$(dirname "$log")"

    # setsid + nohup: the broker gets its own session and outlives this script
    # and the shell that ran it.
    (cd "$dir" && exec setsid nohup tansu broker \
        --listener-url "tcp://127.0.0.1:$port" \
        --advertised-listener-url "tcp://127.0.0.1:$port" \
        --storage-engine sqlite://tansu.db \
        >>"$log" 2>&1 </dev/null) &
    local pid=$!

    local deadline=$((SECONDS + TANSU_READY_TIMEOUT))
    until port_open "$port"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 20 "$log" >&2 || true
            die "broker exited during startup (log: $log)"
        fi
        if ((SECONDS >= deadline)); then
            tail -n 20 "$log" >&2 || true
            kill "$pid" 2>/dev/null || true
            die "broker did not accept connections on 127.0.0.1:$port within ${TANSU_READY_TIMEOUT}s (log: $log)"
        fi
        sleep 0.2
    done

    # $! is the broker itself: a background job of a non-interactive shell is no
    # process-group leader, so setsid does not fork, and nohup execs.
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == tansu ]] ||
        echo "tansu.sh: warning: pid $pid is not the tansu process" >&2

    local rc=0
    add_index "$dir" || rc=$?
    case $rc in
        0) ;;
        2) echo "tansu.sh: warning: $dir/tansu.db has no header table yet; index not added" >&2 ;;
        *) die "could not add index to $dir/tansu.db" ;;
    esac
    echo "$pid"
}

stop() {
    [[ $# -eq 1 && $1 =~ ^[0-9]+$ ]] || die "usage: stop PID"
    local pid="$1"
    kill -0 "$pid" 2>/dev/null || return 0
    kill "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 10))
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            kill -9 "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.1
    done
}

index() {
    [[ $# -eq 1 ]] || die "usage: index DIR"
    local rc=0
    add_index "$1" || rc=$?
    case $rc in
        0) ;;
        2) die "$1/tansu.db missing or has no header table yet" ;;
        *) die "could not add index to $1/tansu.db" ;;
    esac
}

cmd="${1:-}"
shift || true
case "$cmd" in
    start) start "$@" ;;
    stop) stop "$@" ;;
    index) index "$@" ;;
    *) die "usage: $0 start PORT DIR [LOG] | stop PID | index DIR" ;;
esac
