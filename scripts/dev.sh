#!/usr/bin/env bash
# make run: start `socialgraph dev` (the embedded mesh on one SQLite file) in the background,
# load a follow graph, verify every answer against the file, print a short tour, and leave
# the mesh serving.
#
#   DATA=path        edge list to load (default: the data set Wiki-Vote.txt beside the repository; when that is
#                    absent, a generated graph of similar size and skew, fixed seed)
#   ID_OFFSET=n      added to every id of DATA (files numbering users from 0 need 1)
#   SG_DEV_DIR=dir   where the SQLite file, log and pid file live (default .socialgraph)
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${CARGO_TARGET_DIR:-target}/debug/socialgraph
DIR=${SG_DEV_DIR:-.socialgraph}
DATA=${DATA:-}
ID_OFFSET=${ID_OFFSET:-0}
export SG_ADMIN_TOKEN=${SG_ADMIN_TOKEN:-dev-admin-token}
mkdir -p "$DIR"

if [[ -z $DATA ]]; then
    if [[ -f ../shared/data/Wiki-Vote.txt ]]; then
        DATA=../shared/data/Wiki-Vote.txt
    else
        DATA=$DIR/generated-follows.txt
        echo "../shared/data is not here: generating a follow graph like Wiki-Vote (7,000 users, 100,000 edges, seed 1) into $DATA"
        "$BIN" gen --users 7000 --edges 100000 --seed 1 "$DATA"
    fi
fi
# One data set per state directory: verify compares the whole mesh with one file.
WANT="$(realpath "$DATA") id-offset $ID_OFFSET"
if [[ -f $DIR/dev.sqlite && -f $DIR/data-set && "$(cat "$DIR/data-set")" != "$WANT" ]]; then
    echo "$DIR already holds $(cat "$DIR/data-set"); to load $WANT run" >&2
    echo "  make stop && rm -rf $DIR    (or pick another state directory: SG_DEV_DIR=dir make run ...)" >&2
    exit 1
fi
echo "$WANT" >"$DIR/data-set"

ours() { [[ -f $DIR/dev.pid ]] && kill -0 "$(cat "$DIR/dev.pid")" 2>/dev/null; }
if ours; then
    echo "socialgraph dev is already running (pid $(cat "$DIR/dev.pid")); using it"
else
    rm -f "$DIR/dev.pid"
    if "$BIN" status >/dev/null 2>&1; then
        echo "another server already answers on 127.0.0.1:50051-50053 (another checkout's socialgraph dev, or make run-mesh?): stop it first" >&2
        exit 1
    fi
    echo "starting socialgraph dev on $DIR/dev.sqlite (log: $DIR/dev.log)"
    NO_COLOR=1 nohup "$BIN" dev --data "$DIR/dev.sqlite" --admin-token "$SG_ADMIN_TOKEN" >"$DIR/dev.log" 2>&1 &
    echo $! >"$DIR/dev.pid"
fi
for _ in $(seq 1 150); do
    if ! ours; then
        echo "socialgraph dev exited; its log:" >&2
        tail -20 "$DIR/dev.log" >&2
        rm -f "$DIR/dev.pid"
        exit 1
    fi
    if "$BIN" status >/dev/null 2>&1; then break; fi
    sleep 0.2
done

echo
echo "== load follows $DATA (id offset $ID_OFFSET)"
"$BIN" load follows --id-offset "$ID_OFFSET" "$DATA"
echo
echo "== verify $DATA"
"$BIN" verify --id-offset "$ID_OFFSET" "$DATA"

# The tour: the most-followed account of the file, and the viewer who follows the most of
# its followers (so familiar followers are not empty).
read -r USER_ID VIEWER < <(
    { if [[ $DATA == *.gz ]]; then gzip -dc "$DATA"; else cat "$DATA"; fi; } |
        tr -d '\r' | awk -v off="$ID_OFFSET" -F'[ \t,]+' '
            /^#/ || NF < 2 || $1 == $2 { next }
            { a[NR] = $1 + off; b[NR] = $2 + off; indeg[$2 + off]++ }
            END {
                for (u in indeg) if (indeg[u] > best) { best = indeg[u]; top = u }
                for (i in a) if (b[i] == top) fan[a[i]] = 1
                for (i in a) if ((b[i] in fan) && a[i] != top) known[a[i]]++
                for (v in known) if (known[v] > most) { most = known[v]; viewer = v }
                print top, viewer
            }'
)
echo
echo "== counters of user $USER_ID (the most followed in the file)"
"$BIN" counters "$USER_ID"
echo
echo "== the newest 5 followers of user $USER_ID"
"$BIN" followers "$USER_ID" --page-size 5
echo
echo "== followers of $USER_ID whom user $VIEWER follows (\"followed by people you know\", first 5)"
"$BIN" familiar "$VIEWER" "$USER_ID" --page-size 5
echo
if command -v curl >/dev/null; then
    echo "== the same counters over HTTP/JSON, through the gateway"
    echo "curl -s http://127.0.0.1:8080/v1/users/$USER_ID/counters"
    curl -s "http://127.0.0.1:8080/v1/users/$USER_ID/counters"
    echo
    echo
fi
cat <<MSG
socialgraph dev keeps serving (pid $(cat "$DIR/dev.pid")): RelationService 127.0.0.1:50051,
ProjectionService 127.0.0.1:50052, CounterService 127.0.0.1:50053, the HTTP/JSON gateway on
http://127.0.0.1:8080 (routes in http://127.0.0.1:8080/openapi.json), metrics on
http://127.0.0.1:9100/metrics. Try next:
  $BIN following $VIEWER --page-size 10
  $BIN relationship $VIEWER $USER_ID
  $BIN common $VIEWER $USER_ID --json
  $BIN status
  curl -s 'http://127.0.0.1:8080/v1/users/$USER_ID/followers?page_size=3'
  curl -s -X POST http://127.0.0.1:8080/v1/users/$VIEWER/following/$USER_ID
  curl -s -X DELETE http://127.0.0.1:8080/v1/users/$VIEWER/following/$USER_ID   (undoes it: make run verifies against the file)
  .venv/bin/grpcurl -plaintext 127.0.0.1:50051 list     (after make deps)
Stop it with: make stop
MSG
