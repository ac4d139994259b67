#!/usr/bin/env bash
# Install (if missing) and start (if stopped) what the test suite needs:
#   postgres  PostgreSQL on 127.0.0.1:5432, user postgres, trust auth
#   mariadb   MariaDB on 127.0.0.1:3306, user root, empty password
#   redis     Redis on 127.0.0.1:6379 (facts and counters: never evicts), the cache Redis on
#             127.0.0.1:6380 (list caches: maxmemory 256mb, allkeys-lru), redis-cli, redis-benchmark
#   sqlite3   the sqlite3 CLI
#   tansu     tansu 0.6.0 (Kafka-compatible broker) on 127.0.0.1:9092,
#             state in /var/lib/socialgraph/tansu/tansu.db
#   python    .venv with the packages in scripts/requirements-dev.txt
#   buf       buf $BUF_VERSION (npm package @bufbuild/buf) in .tools/, for the proto lint and
#             breaking-change checks of `make test-proto`
#   browser   Debian's chromium (headless) and tesseract-ocr, for the gateway's browser test
#             (integration-tests/tests/gateway_browser.rs: a page follows through the gateway,
#             and the screenshot is read back as text)
#   promtool  promtool (Debian's prometheus package; the server is not started), which checks the
#             chart's alert rules and the services' /metrics output
#   mdbook    mdBook $MDBOOK_VERSION (cargo install from crates.io, 2-5 minutes on 2 cores the
#             first time), which builds the book in docs/ (make test-docs, make docs)
#
# Usage: scripts/deps.sh [--check] [STEP...]
#   no STEP     all of the above, in that order
#   --check     only report what is up/down; exit 1 if anything is down
#
# Idempotent: run it as often as you like (it is what `make deps` runs). Meant
# for Debian 12 as root; as another user, installs and starts go through sudo.

# shellcheck disable=SC2317,SC2012  # step_* are called indirectly; ls of /etc/postgresql is fine
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ALL_STEPS=(postgres mariadb redis sqlite3 tansu python buf browser promtool mdbook)

TANSU_VERSION=0.6.0
TANSU_PORT=9092
TANSU_DIR=/var/lib/socialgraph/tansu
TANSU_LOG=/var/log/socialgraph/tansu.log
VENV="$ROOT/.venv"
REQUIREMENTS="$ROOT/scripts/requirements-dev.txt"
STAMP="$VENV/.requirements.sha256"
BUF_VERSION=1.75.0
BUF="$ROOT/.tools/node_modules/.bin/buf"
MDBOOK_VERSION=0.5.4

export PATH="$PATH:${HOME:-/root}/.cargo/bin"
export DEBIAN_FRONTEND=noninteractive

CHECK=0
STEPS=()
for arg in "$@"; do
    case "$arg" in
        --check) CHECK=1 ;;
        -h | --help) sed -n '2,/^$/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
        postgres | mariadb | redis | sqlite3 | tansu | python | buf | browser | promtool | mdbook) STEPS+=("$arg") ;;
        *) echo "deps.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done
((${#STEPS[@]})) || STEPS=("${ALL_STEPS[@]}")

DOWN=0
say() { echo "$1: $2"; }
fail() { echo "$1: FAILED: $2" >&2; exit 1; }
down() { say "$1" "DOWN ($2)"; DOWN=1; }

as_root() {
    if [[ $EUID -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

APT_UPDATED=0
apt_install() {
    if ((APT_UPDATED == 0)); then
        as_root apt-get update -qq || fail apt "apt-get update failed"
        APT_UPDATED=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null ||
        fail apt "apt-get install $* failed"
}

port_open() { timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# wait_for SECONDS CMD...: poll CMD until it succeeds or SECONDS pass.
wait_for() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || return 1
        sleep 0.5
    done
}

# ---------------------------------------------------------------- postgres
pg_version() { ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1; }
pg_login() { PGCONNECT_TIMEOUT=3 psql -w -h 127.0.0.1 -p 5432 -U postgres -d postgres -Atqc 'select 1' 2>/dev/null | grep -qx 1; }
pg_accepting() { pg_isready -q -h 127.0.0.1 -p 5432 -t 2; }

step_postgres() {
    if ((CHECK)); then
        if pg_login; then say postgres "up on 127.0.0.1:5432"; else down postgres "no trust login as postgres on 127.0.0.1:5432"; fi
        return
    fi
    if pg_login; then say postgres "running on 127.0.0.1:5432"; return; fi

    local did=()
    if ! command -v pg_ctlcluster >/dev/null || [[ -z $(pg_version) ]]; then
        apt_install postgresql postgresql-contrib
        did+=(installed)
    fi
    local ver
    ver=$(pg_version)
    [[ -n $ver ]] || fail postgres "no cluster under /etc/postgresql after install"
    if [[ ! -d /etc/postgresql/$ver/main ]]; then
        as_root pg_createcluster "$ver" main >/dev/null || fail postgres "pg_createcluster $ver main failed"
    fi
    if ! pg_accepting; then
        as_root pg_ctlcluster --skip-systemctl-redirect "$ver" main start ||
            fail postgres "pg_ctlcluster $ver main start failed (see /var/log/postgresql/)"
        wait_for 30 pg_accepting || fail postgres "not accepting connections on 127.0.0.1:5432 after 30s"
        did+=(started)
    fi
    if ! pg_login; then
        # A fresh Debian cluster wants a password on 127.0.0.1: let user postgres
        # in without one, ahead of the stock rules (first match wins).
        local hba="/etc/postgresql/$ver/main/pg_hba.conf"
        if ! as_root grep -q '^host[[:space:]]\+all[[:space:]]\+postgres[[:space:]]\+127\.0\.0\.1/32[[:space:]]\+trust' "$hba"; then
            local tmp
            tmp=$(mktemp)
            {
                echo "# socialgraph tests (scripts/deps.sh): user postgres over loopback without password"
                echo "host    all    postgres    127.0.0.1/32    trust"
                echo "host    all    postgres    ::1/128         trust"
                as_root cat "$hba"
            } >"$tmp"
            as_root sh -c "cat '$tmp' > '$hba'"   # keeps the file's owner and mode
            rm -f "$tmp"
        fi
        as_root pg_ctlcluster --skip-systemctl-redirect "$ver" main reload || fail postgres "reload failed"
        wait_for 10 pg_login || fail postgres "cannot log in as postgres on 127.0.0.1:5432 without a password (check $hba)"
        did+=(trust-auth)
    fi
    say postgres "$(IFS=,; echo "${did[*]:-running}") on 127.0.0.1:5432"
}

# ----------------------------------------------------------------- mariadb
my_login() { mysql --connect-timeout=3 -h 127.0.0.1 -P 3306 -uroot -N -B -e 'select 1' 2>/dev/null | grep -qx 1; }

step_mariadb() {
    if ((CHECK)); then
        if my_login; then say mariadb "up on 127.0.0.1:3306"; else down mariadb "no passwordless root login on 127.0.0.1:3306"; fi
        return
    fi
    if my_login; then say mariadb "running on 127.0.0.1:3306"; return; fi

    local did=()
    if [[ ! -x /usr/sbin/mariadbd ]] || ! command -v mysql >/dev/null; then
        apt_install mariadb-server mariadb-client
        did+=(installed)
    fi
    # The package's own start may have worked (or not: no systemd here).
    if ! port_open 3306; then
        # mariadbd needs its runtime dir for the socket and pid file; --user
        # because a root-started mariadbd refuses to run as root otherwise
        # (Debian's stock config leaves `user = mysql` commented out).
        as_root install -d -o mysql -g mysql -m 755 /run/mysqld
        as_root mkdir -p /var/log/mysql
        as_root start-stop-daemon --start --oknodo --background \
            --output /var/log/mysql/ci-start.log \
            --exec /usr/sbin/mariadbd -- --user=mysql ||
            fail mariadb "start-stop-daemon failed"
        wait_for 60 port_open 3306 ||
            fail mariadb "not listening on 127.0.0.1:3306 after 60s (see /var/log/mysql/)"
        did+=(started)
    fi
    if ! my_login; then
        # Fresh Debian: root@localhost uses unix_socket auth only and there is
        # no root@127.0.0.1. Over the socket (root's unix_socket login), give
        # root an empty password over TCP as well.
        wait_for 15 as_root mysql --protocol=socket -uroot -e 'select 1' ||
            fail mariadb "cannot log in as root over the unix socket to fix TCP login"
        as_root mysql --protocol=socket -uroot <<'SQL' || fail mariadb "could not set up root login over TCP"
CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
CREATE USER IF NOT EXISTS 'root'@'::1' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'::1' WITH GRANT OPTION;
ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket;
FLUSH PRIVILEGES;
SQL
        wait_for 10 my_login || fail mariadb "root still cannot log in on 127.0.0.1:3306 without a password"
        did+=(tcp-root-login)
    fi
    say mariadb "$(IFS=,; echo "${did[*]:-running}") on 127.0.0.1:3306"
}

# ------------------------------------------------------------------- redis
redis_ping() { [[ $(redis-cli -h 127.0.0.1 -p "${1:-6379}" ping 2>/dev/null) == PONG ]]; }
CACHE_REDIS_PORT=6380

step_redis() {
    if ((CHECK)); then
        if ! command -v redis-benchmark >/dev/null; then down redis "redis-benchmark missing"
        elif ! redis_ping; then down redis "no PONG on 127.0.0.1:6379"
        elif ! redis_ping $CACHE_REDIS_PORT; then down redis "no PONG from the cache Redis on 127.0.0.1:$CACHE_REDIS_PORT"
        else say redis "up on 127.0.0.1:6379 and (cache) 127.0.0.1:$CACHE_REDIS_PORT"; fi
        return
    fi
    local did=()
    if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null || ! command -v redis-benchmark >/dev/null; then
        apt_install redis-server redis-tools
        did+=(installed)
    fi
    if ! redis_ping; then
        as_root mkdir -p /var/lib/redis /var/log/redis
        as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
            --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log >/dev/null ||
            fail redis "redis-server failed to start (see /var/log/redis/ci.log)"
        wait_for 15 redis_ping || fail redis "no PONG on 127.0.0.1:6379 after 15s (see /var/log/redis/ci.log)"
        did+=(started)
    fi
    if ! redis_ping $CACHE_REDIS_PORT; then
        as_root mkdir -p /var/lib/redis-cache /var/log/redis
        as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port $CACHE_REDIS_PORT --save "" \
            --appendonly no --maxmemory 256mb --maxmemory-policy allkeys-lru --dir /var/lib/redis-cache \
            --logfile /var/log/redis/cache.log >/dev/null ||
            fail redis "the cache redis-server failed to start (see /var/log/redis/cache.log)"
        wait_for 15 redis_ping $CACHE_REDIS_PORT || fail redis "no PONG on 127.0.0.1:$CACHE_REDIS_PORT after 15s (see /var/log/redis/cache.log)"
        did+=("cache started")
    fi
    say redis "$(IFS=,; echo "${did[*]:-running}") on 127.0.0.1:6379 and (cache) 127.0.0.1:$CACHE_REDIS_PORT"
}

# ----------------------------------------------------------------- sqlite3
step_sqlite3() {
    if command -v sqlite3 >/dev/null; then
        say sqlite3 "present ($(sqlite3 --version | cut -d' ' -f1))"
    elif ((CHECK)); then
        down sqlite3 "not installed"
    else
        apt_install sqlite3
        say sqlite3 "installed ($(sqlite3 --version | cut -d' ' -f1))"
    fi
}

# ----------------------------------------------------------------- browser
step_browser() {
    if command -v chromium >/dev/null && command -v tesseract >/dev/null; then
        say browser "present ($(chromium --version 2>/dev/null | head -n 1); tesseract $(tesseract --version 2>&1 | head -n 1 | cut -d' ' -f2))"
    elif ((CHECK)); then
        down browser "chromium or tesseract not installed"
    else
        apt_install chromium tesseract-ocr fonts-dejavu-core
        say browser "installed ($(chromium --version 2>/dev/null | head -n 1))"
    fi
}

# ---------------------------------------------------------------- promtool
step_promtool() {
    if command -v promtool >/dev/null; then
        say promtool "present ($(promtool --version 2>&1 | head -n 1 | cut -d' ' -f3))"
    elif ((CHECK)); then
        down promtool "not installed"
    else
        # Only the binary is wanted: nothing here starts the Prometheus server it comes with.
        apt_install --no-install-recommends prometheus
        say promtool "installed ($(promtool --version 2>&1 | head -n 1 | cut -d' ' -f3))"
    fi
}

# ------------------------------------------------------------------- tansu
tansu_ok() { command -v tansu >/dev/null && [[ $(tansu --version 2>/dev/null) == *" $TANSU_VERSION" ]]; }
tansu_index_ok() {
    [[ $(sqlite3 -cmd '.timeout 5000' "$TANSU_DIR/tansu.db" \
        "select count(*) from sqlite_master where type = 'index' and name = 'header_topition_offset'" 2>/dev/null) == 1 ]]
}

step_tansu() {
    if ((CHECK)); then
        if ! tansu_ok; then down tansu "tansu $TANSU_VERSION not installed"
        elif ! port_open "$TANSU_PORT"; then down tansu "nothing listening on 127.0.0.1:$TANSU_PORT"
        elif ! tansu_index_ok; then down tansu "index header_topition_offset missing in $TANSU_DIR/tansu.db"
        else say tansu "up on 127.0.0.1:$TANSU_PORT"; fi
        return
    fi
    local did=()
    if ! tansu_ok; then
        # Never run two of these at once: they would fight over the same
        # target dir and the 2 cores.
        local other
        other=$(pgrep -f "cargo install tansu" | head -n 1 || true)
        if [[ -n $other ]]; then
            say tansu "waiting for the running 'cargo install tansu' (pid $other) to finish"
            while kill -0 "$other" 2>/dev/null; do sleep 10; done
        fi
        if ! tansu_ok; then
            command -v cargo >/dev/null || fail tansu "cargo not found (needed to install tansu $TANSU_VERSION)"
            say tansu "installing $TANSU_VERSION with cargo install (takes 15-25 min on 2 cores)"
            cargo install tansu --version "$TANSU_VERSION" --locked --features dynostore,libsql ||
                fail tansu "cargo install tansu $TANSU_VERSION failed"
            tansu_ok || fail tansu "installed, but 'tansu --version' does not report $TANSU_VERSION"
        fi
        did+=(installed)
    fi
    command -v sqlite3 >/dev/null || fail tansu "sqlite3 missing (run the sqlite3 step)"
    if ! port_open "$TANSU_PORT"; then
        as_root mkdir -p "$TANSU_DIR" "$(dirname "$TANSU_LOG")"
        local pid
        pid=$(as_root "$ROOT/scripts/tansu.sh" start "$TANSU_PORT" "$TANSU_DIR" "$TANSU_LOG") ||
            fail tansu "broker did not start (see $TANSU_LOG)"
        echo "$pid" | as_root tee "$TANSU_DIR/tansu.pid" >/dev/null
        did+=("started (pid $pid)")
    fi
    # tansu creates every table, header included, at startup, so once the port
    # is open the index can go in; this also covers a broker started elsewhere.
    if ! tansu_index_ok; then
        as_root "$ROOT/scripts/tansu.sh" index "$TANSU_DIR" || fail tansu "could not add index to $TANSU_DIR/tansu.db"
        ((${#did[@]})) || did+=(running)
        did+=("index added")
    fi
    say tansu "$(IFS=,; echo "${did[*]:-running}") on 127.0.0.1:$TANSU_PORT"
}

# ------------------------------------------------------------------ python
req_hash() { sha256sum "$REQUIREMENTS" | cut -d' ' -f1; }
venv_ok() { [[ -x $VENV/bin/python && -f $STAMP && $(cat "$STAMP") == "$(req_hash)" ]]; }

step_python() {
    [[ -f $REQUIREMENTS ]] || fail python "$REQUIREMENTS missing"
    if ((CHECK)); then
        if venv_ok; then say python "up to date ($VENV)"; else down python "$VENV missing or not in sync with scripts/requirements-dev.txt"; fi
        return
    fi
    if venv_ok; then say python "up to date ($VENV)"; return; fi
    local did=()
    if [[ ! -x $VENV/bin/python ]]; then
        rm -rf "$VENV"
        if ! python3 -m venv "$VENV" 2>/dev/null; then
            rm -rf "$VENV"
            apt_install python3-venv
            python3 -m venv "$VENV" || fail python "python3 -m venv failed"
        fi
        did+=(created)
    fi
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQUIREMENTS" ||
        fail python "pip install -r scripts/requirements-dev.txt failed"
    req_hash >"$STAMP"
    did+=(installed)
    say python "$(IFS=,; echo "${did[*]}") ($VENV)"
}

# ------------------------------------------------------------------ buf
buf_ok() { [[ -x $BUF && $("$BUF" --version 2>/dev/null) == "$BUF_VERSION" ]]; }

step_buf() {
    if ((CHECK)); then
        if buf_ok; then say buf "$BUF_VERSION ($BUF)"; else down buf "$BUF missing or not $BUF_VERSION"; fi
        return
    fi
    if buf_ok; then say buf "$BUF_VERSION ($BUF)"; return; fi
    command -v npm >/dev/null || apt_install nodejs npm
    npm install --silent --no-audit --no-fund --prefix "$ROOT/.tools" "@bufbuild/buf@$BUF_VERSION" >/dev/null ||
        fail buf "npm install @bufbuild/buf@$BUF_VERSION failed"
    buf_ok || fail buf "$BUF does not report version $BUF_VERSION"
    say buf "installed $BUF_VERSION ($BUF)"
}

# ------------------------------------------------------------------ mdbook
mdbook_ok() { command -v mdbook >/dev/null && [[ $(mdbook --version 2>/dev/null) == "mdbook v$MDBOOK_VERSION" ]]; }

step_mdbook() {
    if ((CHECK)); then
        if mdbook_ok; then say mdbook "$MDBOOK_VERSION"; else down mdbook "mdbook $MDBOOK_VERSION not installed"; fi
        return
    fi
    if mdbook_ok; then say mdbook "$MDBOOK_VERSION"; return; fi
    command -v cargo >/dev/null || fail mdbook "cargo not found (needed to install mdbook $MDBOOK_VERSION)"
    say mdbook "installing $MDBOOK_VERSION with cargo install (2-5 min on 2 cores)"
    cargo install mdbook --version "$MDBOOK_VERSION" --locked --quiet ||
        fail mdbook "cargo install mdbook $MDBOOK_VERSION failed"
    mdbook_ok || fail mdbook "installed, but 'mdbook --version' does not report v$MDBOOK_VERSION"
    say mdbook "installed $MDBOOK_VERSION"
}

for step in "${STEPS[@]}"; do
    "step_$step"
done
if ((CHECK && DOWN)); then exit 1; fi
exit 0
