#!/usr/bin/env bash
# `make run-mesh`: the distributed mesh on this machine, against the services `make deps` started.
# DB_URL, ADMIN_TOKEN, PAGE_SECRET, REDIS_URL (relation-svc's token buckets and counter-svc's
# counters; a redis+cluster:// URL names a Redis Cluster) and CACHE_URL (the cache Redis; ""
# turns the list caches off) override the defaults below.
# Creates the `socialgraph` database on the local PostgreSQL if missing, runs migrations,
# starts relation-svc (:50051, admin :9101), projection-svc (:50052, admin :9102) and
# counter-svc (:50053, admin :9103), message-svc (:50054, admin :9105) and the HTTP/JSON gateway
# (:8080, admin :9104), and leaves
# them serving in the foreground (Ctrl-C stops them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Each service refuses settings it does not know, so each gets only its own variables.
DB_URL="${DB_URL:-postgres://postgres@127.0.0.1:5432/socialgraph}"
ADMIN_TOKEN="${ADMIN_TOKEN:-dev-admin-token}"
PAGE_SECRET="${PAGE_SECRET:-dev-page-token-secret}"
CACHE_URL="${CACHE_URL-redis://127.0.0.1:6380}"
REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
BIN=target/debug
common_env=(SG_DATABASE__URL="$DB_URL" SG_AUTH__ADMIN_TOKEN="$ADMIN_TOKEN" SG_AUTH__PAGE_TOKEN_SECRET="$PAGE_SECRET" SG_CACHE__URL="$CACHE_URL")
relation_env=("${common_env[@]}" SG_REDIS__URL="$REDIS_URL")
projection_env=("${common_env[@]}" SG_RELATION__ADMIN_TOKEN="$ADMIN_TOKEN")
counter_env=(SG_AUTH__ADMIN_TOKEN="$ADMIN_TOKEN" SG_REDIS__URL="$REDIS_URL" SG_MESSAGE__URL=http://127.0.0.1:50054)
message_env=(SG_DATABASE__URL="$DB_URL" SG_AUTH__PAGE_TOKEN_SECRET="$PAGE_SECRET")

if [[ "$DB_URL" == postgres://*/socialgraph ]] &&
    ! psql -h 127.0.0.1 -U postgres -tAc "select 1 from pg_database where datname='socialgraph'" | grep -q 1; then
    psql -h 127.0.0.1 -U postgres -qc "create database socialgraph"
    echo "created database socialgraph"
fi
env "${relation_env[@]}" "$BIN/relation-svc" migrate
echo "migrations applied to $DB_URL"

pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait' EXIT INT TERM
env "${relation_env[@]}" "$BIN/relation-svc" serve & pids+=($!)
env "${projection_env[@]}" "$BIN/projection-svc" serve & pids+=($!)
env "${counter_env[@]}" "$BIN/counter-svc" serve & pids+=($!)
env "${message_env[@]}" "$BIN/message-svc" serve & pids+=($!)
"$BIN/gateway" serve & pids+=($!)

for port in 50051 50052 50053 50054 8080; do
    up=0
    for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && up=1 && break; sleep 0.1; done
    if [[ $up == 0 ]]; then
        echo "nothing listens on 127.0.0.1:$port after 10 s: a service did not start (its error is above)" >&2
        exit 1
    fi
done
cat <<MSG

socialgraph is serving:
  relation-svc    grpc 127.0.0.1:50051   admin http://127.0.0.1:9101/metrics
  projection-svc  grpc 127.0.0.1:50052   admin http://127.0.0.1:9102/metrics
  counter-svc     grpc 127.0.0.1:50053   admin http://127.0.0.1:9103/metrics
  message-svc     grpc 127.0.0.1:50054   admin http://127.0.0.1:9105/metrics
  gateway         http://127.0.0.1:8080  admin http://127.0.0.1:9104/metrics  (routes: /openapi.json)

Try (grpcurl is in .venv/bin after make deps):
  .venv/bin/grpcurl -plaintext -d '{"follower_id":1,"followee_id":2}' 127.0.0.1:50051 socialgraph.relation.v1.RelationService/Follow
  .venv/bin/grpcurl -plaintext -d '{"user_id":2}' 127.0.0.1:50052 socialgraph.projection.v1.ProjectionService/ListFollowers
  .venv/bin/grpcurl -plaintext 127.0.0.1:50052 socialgraph.projection.v1.ProjectionService/GetProjectionStatus
  .venv/bin/grpcurl -plaintext -d '{"user_id":2}' 127.0.0.1:50053 socialgraph.counter.v1.CounterService/GetUserCounters
  .venv/bin/grpcurl -plaintext -d '{"actor_id":1,"entity":{"entity_type":"post","entity_id":7}}' 127.0.0.1:50053 socialgraph.counter.v1.CounterService/Like
  .venv/bin/grpcurl -plaintext -d '{"sender_id":1,"recipient_id":2,"client_message_id":"m1","body":"aGk="}' 127.0.0.1:50054 socialgraph.message.v1.MessageService/SendMessage
  .venv/bin/grpcurl -plaintext -d '{"user_id":2}' 127.0.0.1:50053 socialgraph.counter.v1.CounterService/GetUnreadCounts
Or over HTTP/JSON:
  curl -s -X POST http://127.0.0.1:8080/v1/users/1/following/2
  curl -s http://127.0.0.1:8080/v1/users/2/followers
  curl -s http://127.0.0.1:8080/v1/users/2/counters
Ctrl-C stops them.
MSG
wait
