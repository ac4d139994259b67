{{/*
What each service reads from its environment. The services refuse unknown SG_ keys, so every
service gets exactly the keys it knows:
  - socialgraph.configData.<name>: non-secret settings, the data of the service's ConfigMap;
  - socialgraph.secretEnvs.<name>: env entries read from Secrets (existing or the chart's own).
Integers go through int64 so that large values never render in float notation.
*/}}

{{/* Logs and traces, the same for every component. Argument: component context. */}}
{{- define "socialgraph.telemetryConfig" -}}
{{- $root := .root -}}
RUST_LOG: {{ default $root.Values.log.level .svc.logLevel | quote }}
{{- if eq $root.Values.log.format "json" }}
SG_LOG_FORMAT: "json"
{{- end }}
{{- with $root.Values.otel.endpoint }}
OTEL_EXPORTER_OTLP_ENDPOINT: {{ . | quote }}
{{- end }}
{{- end -}}

{{/*
Settings every service shares (the gateway has none of them); the relation topic only for the
services that read it (message-svc publishes its own topic only). Argument: component context.
*/}}
{{- define "socialgraph.commonConfig" -}}
{{- $root := .root -}}
{{- $svc := .svc -}}
SG_SERVER__GRPC_ADDR: {{ include "socialgraph.listenAddr" (list $root $svc.ports.grpc) | quote }}
SG_SERVER__ADMIN_ADDR: {{ include "socialgraph.listenAddr" (list $root $svc.ports.admin) | quote }}
SG_SERVER__REQUEST_TIMEOUT_MS: {{ $svc.server.requestTimeoutMs | int64 | quote }}
SG_SERVER__CONCURRENCY_LIMIT: {{ $svc.server.concurrencyLimit | int64 | quote }}
SG_SERVER__CONCURRENCY_LIMIT_PER_CONNECTION: {{ $svc.server.concurrencyLimitPerConnection | int64 | quote }}
SG_SERVER__DRAIN_TIMEOUT_MS: {{ $svc.server.drainTimeoutMs | int64 | quote }}
{{ include "socialgraph.telemetryConfig" . }}
{{- if not $root.Values.kafka.existingSecret }}
SG_KAFKA__BROKERS: {{ $root.Values.kafka.brokers | toJson | quote }}
{{- end }}
{{- if has .name (list "relation" "projection" "counter") }}
SG_KAFKA__RELATION_TOPIC: {{ $root.Values.kafka.relationTopic | quote }}
{{- end }}
{{- if has .name (list "relation" "projection" "message") }}
SG_KAFKA__ACCOUNT_TOPIC: {{ $root.Values.kafka.accountTopic | quote }}
{{- end }}
{{- if has .name (list "projection" "counter") }}
SG_KAFKA__EDGE_COUNT_TOPIC: {{ $root.Values.kafka.edgeCountTopic | quote }}
{{- end }}
SG_KAFKA__PARTITIONS: {{ $root.Values.kafka.partitions | int64 | quote }}
{{- end -}}

{{- define "socialgraph.configData.relation" -}}
{{- $v := .root.Values -}}
{{- $svc := .svc -}}
{{ include "socialgraph.commonConfig" . }}
SG_KAFKA__REQUEST_DEADLINE_MS: {{ $v.kafka.requestDeadlineMs | int64 | quote }}
SG_KAFKA__RELAY_BATCH_SIZE: {{ $svc.kafka.relayBatchSize | int64 | quote }}
SG_KAFKA__RELAY_IDLE_POLL_MS: {{ $svc.kafka.relayIdlePollMs | int64 | quote }}
SG_KAFKA__RELAY_ENABLED: {{ $svc.kafka.relayEnabled | toString | quote }}
SG_DATABASE__MAX_CONNECTIONS: {{ $svc.database.maxConnections | int64 | quote }}
SG_DATABASE__MIGRATE_ON_START: {{ $svc.database.migrateOnStart | toString | quote }}
{{- with $v.redis.keyPrefix }}
SG_REDIS__KEY_PREFIX: {{ . | quote }}
{{- end }}
SG_REDIS__POOL_SIZE: {{ $svc.redis.poolSize | int64 | quote }}
SG_REDIS__TIMEOUT_MS: {{ $svc.redis.timeoutMs | int64 | quote }}
{{- with $v.cache.keyPrefix }}
SG_CACHE__KEY_PREFIX: {{ . | quote }}
{{- end }}
SG_CACHE__POOL_SIZE: {{ $svc.cache.poolSize | int64 | quote }}
SG_CACHE__TIMEOUT_MS: {{ $svc.cache.timeoutMs | int64 | quote }}
SG_CACHE__TTL_SECS: {{ $svc.cache.ttlSecs | int64 | quote }}
SG_CACHE__FOLLOWING_MAX: {{ $svc.cache.followingMax | int64 | quote }}
{{- /* relation-svc writes its callers' follows through to the follower windows projection-svc
fills, and remembers relationships in their hashes: the limits of both must agree. */}}
SG_CACHE__FOLLOWERS_WINDOW: {{ $v.projection.cache.followersWindow | int64 | quote }}
SG_CACHE__RELATIONSHIP_MAX: {{ $v.projection.cache.relationshipMax | int64 | quote }}
SG_CACHE__FILL_SLOTS: {{ $svc.cache.fillSlots | int64 | quote }}
SG_CACHE__FILL_AFTER_MISSES: {{ $svc.cache.fillAfterMisses | int64 | quote }}
SG_CACHE__FILL_ROWS_PER_SEC: {{ $svc.cache.fillRowsPerSec | int64 | quote }}
SG_LIMITS__FOLLOWING_CAP: {{ $svc.limits.followingCap | int64 | quote }}
SG_LIMITS__FOLLOW_BURST: {{ $svc.limits.followBurst | int64 | quote }}
SG_LIMITS__FOLLOW_REFILL_PER_DAY: {{ $svc.limits.followRefillPerDay | int64 | quote }}
SG_LIMITS__ON_REDIS_ERROR: {{ $svc.limits.onRedisError | quote }}
SG_LIMITS__IMPORT_BATCH_SIZE: {{ $svc.limits.importBatchSize | int64 | quote }}
{{- end -}}

{{- define "socialgraph.configData.projection" -}}
{{- $v := .root.Values -}}
{{- $svc := .svc -}}
{{ include "socialgraph.commonConfig" . }}
SG_KAFKA__REQUEST_DEADLINE_MS: {{ $v.kafka.requestDeadlineMs | int64 | quote }}
SG_DATABASE__MAX_CONNECTIONS: {{ $svc.database.maxConnections | int64 | quote }}
SG_DATABASE__MIGRATE_ON_START: {{ $svc.database.migrateOnStart | toString | quote }}
SG_DATABASE__CONSUMER_NAME: {{ $svc.database.consumerName | quote }}
{{- with $v.cache.keyPrefix }}
SG_CACHE__KEY_PREFIX: {{ . | quote }}
{{- end }}
SG_CACHE__POOL_SIZE: {{ $svc.cache.poolSize | int64 | quote }}
SG_CACHE__TIMEOUT_MS: {{ $svc.cache.timeoutMs | int64 | quote }}
SG_CACHE__TTL_SECS: {{ $svc.cache.ttlSecs | int64 | quote }}
{{- /* projection-svc keeps relation-svc's following lists in step with the events. */}}
SG_CACHE__FOLLOWING_MAX: {{ $v.relation.cache.followingMax | int64 | quote }}
SG_CACHE__FOLLOWERS_WINDOW: {{ $svc.cache.followersWindow | int64 | quote }}
SG_CACHE__POSTS_WINDOW: {{ $svc.cache.postsWindow | int64 | quote }}
SG_CACHE__RELATIONSHIP_MAX: {{ $svc.cache.relationshipMax | int64 | quote }}
SG_CACHE__DEEP_PAGES_PER_SEC: {{ $svc.cache.deepPagesPerSec | int64 | quote }}
SG_CACHE__HOT_READS_PER_SEC: {{ $svc.cache.hotReadsPerSec | int64 | quote }}
SG_CACHE__HOT_STALENESS_MS: {{ $svc.cache.hotStalenessMs | int64 | quote }}
SG_CACHE__FILL_SLOTS: {{ $svc.cache.fillSlots | int64 | quote }}
SG_CACHE__FILL_AFTER_MISSES: {{ $svc.cache.fillAfterMisses | int64 | quote }}
SG_CACHE__FILL_ROWS_PER_SEC: {{ $svc.cache.fillRowsPerSec | int64 | quote }}
SG_KAFKA__CONTENT_TOPIC: {{ $v.kafka.contentTopic | quote }}
SG_FEED__MODE: {{ $svc.feed.mode | quote }}
SG_FEED__PULL_THRESHOLD: {{ $svc.feed.pullThreshold | int64 | quote }}
SG_FEED__INBOX_SIZE: {{ $svc.feed.inboxSize | int64 | quote }}
SG_FEED__FANOUT_BATCH: {{ $svc.feed.fanoutBatch | int64 | quote }}
SG_FEED__ENTITY_TYPE: {{ $svc.feed.entityType | quote }}
SG_KAFKA__RELAY_BATCH_SIZE: {{ $svc.kafka.relayBatchSize | int64 | quote }}
SG_KAFKA__RELAY_IDLE_POLL_MS: {{ $svc.kafka.relayIdlePollMs | int64 | quote }}
SG_KAFKA__RELAY_ENABLED: {{ $svc.kafka.relayEnabled | toString | quote }}
SG_CONSUMER__MAX_WAIT_MS: {{ $svc.consumer.maxWaitMs | int64 | quote }}
SG_CONSUMER__MAX_BYTES: {{ $svc.consumer.maxBytes | int64 | quote }}
SG_CONSUMER__IDLE_MAX_MS: {{ $svc.consumer.idleMaxMs | int64 | quote }}
SG_CONSUMER__DEEP_IDLE_AFTER_MS: {{ $svc.consumer.deepIdleAfterMs | int64 | quote }}
SG_CONSUMER__DEEP_IDLE_MS: {{ $svc.consumer.deepIdleMs | int64 | quote }}
SG_RELATION__URL: {{ default (include "socialgraph.serviceUrl" (list .root "relation")) $svc.relationUrl | quote }}
{{- end -}}

{{- define "socialgraph.configData.counter" -}}
{{- $v := .root.Values -}}
{{- $svc := .svc -}}
{{ include "socialgraph.commonConfig" . }}
SG_KAFKA__COUNTER_TOPIC: {{ $v.kafka.counterTopic | quote }}
SG_KAFKA__CONTENT_TOPIC: {{ $v.kafka.contentTopic | quote }}
{{- with $v.redis.keyPrefix }}
SG_REDIS__KEY_PREFIX: {{ . | quote }}
{{- end }}
SG_KAFKA__REQUEST_DEADLINE_MS: {{ $v.kafka.requestDeadlineMs | int64 | quote }}
SG_REDIS__POOL_SIZE: {{ $svc.redis.poolSize | int64 | quote }}
SG_REDIS__TIMEOUT_MS: {{ $svc.redis.timeoutMs | int64 | quote }}
SG_CONSUMER__MAX_WAIT_MS: {{ $svc.consumer.maxWaitMs | int64 | quote }}
SG_CONSUMER__MAX_BYTES: {{ $svc.consumer.maxBytes | int64 | quote }}
SG_CONSUMER__IDLE_MAX_MS: {{ $svc.consumer.idleMaxMs | int64 | quote }}
SG_CONSUMER__DEEP_IDLE_AFTER_MS: {{ $svc.consumer.deepIdleAfterMs | int64 | quote }}
SG_CONSUMER__DEEP_IDLE_MS: {{ $svc.consumer.deepIdleMs | int64 | quote }}
SG_COUNTERS__CHECK_INTERVAL_SECS: {{ $svc.counters.checkIntervalSecs | int64 | quote }}
{{- /* verifyAfterMs: the old name, used for one more release when set. projectionWaitMs and
rebuildWaitMs are retired (the notes say so): nothing is rendered for them. */}}
SG_COUNTERS__RELAY_QUIET_MS: {{ ternary $svc.counters.verifyAfterMs $svc.counters.relayQuietMs (not (kindIs "invalid" $svc.counters.verifyAfterMs)) | int64 | quote }}
SG_PROJECTION__URL: {{ default (include "socialgraph.serviceUrl" (list .root "projection")) $svc.projectionUrl | quote }}
{{- if $v.message.enabled }}
{{- /* Unread counters: consume the message topic and copy states from this release's message-svc. */}}
SG_KAFKA__MESSAGE_TOPIC: {{ $v.kafka.messageTopic | quote }}
SG_MESSAGE__URL: {{ include "socialgraph.serviceUrl" (list .root "message") | quote }}
{{- end }}
{{- end -}}

{{/*
message-svc: [server], [database], [kafka] (its topic, its relay, live delivery's tail and the
account events it consumes: deletions and blocks), [messages], [subscribe] and [auth]
(the page-token key, from secretEnvs), [consumer] (the account events; every replica reads every
partition: the events are few and applying one twice changes nothing).
*/}}
{{- define "socialgraph.configData.message" -}}
{{- $v := .root.Values -}}
{{- $svc := .svc -}}
{{ include "socialgraph.commonConfig" . }}
SG_KAFKA__MESSAGE_TOPIC: {{ $v.kafka.messageTopic | quote }}
SG_KAFKA__REQUEST_DEADLINE_MS: {{ $v.kafka.requestDeadlineMs | int64 | quote }}
SG_KAFKA__RELAY_BATCH_SIZE: {{ $svc.kafka.relayBatchSize | int64 | quote }}
SG_KAFKA__RELAY_IDLE_POLL_MS: {{ $svc.kafka.relayIdlePollMs | int64 | quote }}
SG_KAFKA__RELAY_ENABLED: {{ $svc.kafka.relayEnabled | toString | quote }}
SG_DATABASE__MAX_CONNECTIONS: {{ $svc.database.maxConnections | int64 | quote }}
SG_DATABASE__MIGRATE_ON_START: {{ $svc.database.migrateOnStart | toString | quote }}
SG_DATABASE__CONSUMER_NAME: {{ $svc.database.consumerName | quote }}
SG_CONSUMER__PARTITIONS: "all"
SG_CONSUMER__MAX_WAIT_MS: {{ $svc.consumer.maxWaitMs | int64 | quote }}
SG_CONSUMER__MAX_BYTES: {{ $svc.consumer.maxBytes | int64 | quote }}
SG_CONSUMER__IDLE_MAX_MS: {{ $svc.consumer.idleMaxMs | int64 | quote }}
SG_CONSUMER__DEEP_IDLE_AFTER_MS: {{ $svc.consumer.deepIdleAfterMs | int64 | quote }}
SG_CONSUMER__DEEP_IDLE_MS: {{ $svc.consumer.deepIdleMs | int64 | quote }}
SG_MESSAGES__MAX_BODY_BYTES: {{ $svc.messages.maxBodyBytes | int64 | quote }}
SG_MESSAGES__MAX_GROUP_MEMBERS: {{ $svc.messages.maxGroupMembers | int64 | quote }}
SG_SUBSCRIBE__IDLE_POLL_MS: {{ $svc.subscribe.idlePollMs | int64 | quote }}
SG_SUBSCRIBE__QUIET_POLL_MS: {{ $svc.subscribe.quietPollMs | int64 | quote }}
SG_SUBSCRIBE__BUFFER: {{ $svc.subscribe.buffer | int64 | quote }}
SG_SUBSCRIBE__MAX_CATCH_UP_RECORDS: {{ $svc.subscribe.maxCatchUpRecords | int64 | quote }}
{{- end -}}

{{/*
The gateway: stateless, no store and no secret; [http] and [upstream] only. The upstream URLs
default to this release's services.
*/}}
{{- define "socialgraph.configData.gateway" -}}
{{- $root := .root -}}
{{- $svc := .svc -}}
{{- $http := $svc.http -}}
{{- $up := $svc.upstream -}}
SG_HTTP__ADDR: {{ include "socialgraph.listenAddr" (list $root $svc.ports.http) | quote }}
SG_HTTP__ADMIN_ADDR: {{ include "socialgraph.listenAddr" (list $root $svc.ports.admin) | quote }}
SG_HTTP__REQUEST_TIMEOUT_MS: {{ $http.requestTimeoutMs | int64 | quote }}
SG_HTTP__MAX_BODY_BYTES: {{ $http.maxBodyBytes | int64 | quote }}
SG_HTTP__MAX_HEADER_BYTES: {{ $http.maxHeaderBytes | int64 | quote }}
SG_HTTP__CONCURRENCY_LIMIT: {{ $http.concurrencyLimit | int64 | quote }}
SG_HTTP__DRAIN_TIMEOUT_MS: {{ $http.drainTimeoutMs | int64 | quote }}
SG_HTTP__CORS_ALLOWED_ORIGINS: {{ $http.corsAllowedOrigins | default (list) | toJson | quote }}
SG_HTTP__CORS_MAX_AGE_SECS: {{ $http.corsMaxAgeSecs | int64 | quote }}
SG_UPSTREAM__RELATION_URL: {{ default (include "socialgraph.serviceUrl" (list $root "relation")) $up.relationUrl | quote }}
SG_UPSTREAM__PROJECTION_URL: {{ default (include "socialgraph.serviceUrl" (list $root "projection")) $up.projectionUrl | quote }}
SG_UPSTREAM__COUNTER_URL: {{ default (include "socialgraph.serviceUrl" (list $root "counter")) $up.counterUrl | quote }}
SG_UPSTREAM__MESSAGE_URL: {{ default (ternary (include "socialgraph.serviceUrl" (list $root "message")) "" $root.Values.message.enabled) $up.messageUrl | quote }}
SG_UPSTREAM__CHANNELS: {{ $up.channels | int64 | quote }}
SG_UPSTREAM__CONNECT_TIMEOUT_MS: {{ $up.connectTimeoutMs | int64 | quote }}
{{ include "socialgraph.telemetryConfig" . }}
{{- end -}}

{{/* Secret env entries and the secret sources they use. Argument: component context. */}}
{{- define "socialgraph.secretNames.relation" -}}
{{- toJson (list "database-url" "redis-url" "cache-redis-url" "kafka-brokers" "admin-token" "page-token-secret") -}}
{{- end -}}
{{- define "socialgraph.secretEnvs.relation" -}}
{{- $src := include "socialgraph.secretSources" .root | fromYaml -}}
{{- include "socialgraph.secretEnv" (list $src "database-url" "SG_DATABASE__URL") }}
{{- include "socialgraph.secretEnv" (list $src "redis-url" "SG_REDIS__URL") }}
{{- include "socialgraph.secretEnv" (list $src "cache-redis-url" "SG_CACHE__URL") }}
{{- include "socialgraph.secretEnv" (list $src "kafka-brokers" "SG_KAFKA__BROKERS") }}
{{- include "socialgraph.secretEnv" (list $src "admin-token" "SG_AUTH__ADMIN_TOKEN") }}
{{- include "socialgraph.secretEnv" (list $src "page-token-secret" "SG_AUTH__PAGE_TOKEN_SECRET") }}
{{- end -}}

{{- define "socialgraph.secretNames.projection" -}}
{{- toJson (list "projection-database-url" "cache-redis-url" "kafka-brokers" "admin-token" "page-token-secret") -}}
{{- end -}}
{{- define "socialgraph.secretEnvs.projection" -}}
{{- $src := include "socialgraph.secretSources" .root | fromYaml -}}
{{- include "socialgraph.secretEnv" (list $src "projection-database-url" "SG_DATABASE__URL") }}
{{- include "socialgraph.secretEnv" (list $src "cache-redis-url" "SG_CACHE__URL") }}
{{- include "socialgraph.secretEnv" (list $src "kafka-brokers" "SG_KAFKA__BROKERS") }}
{{- include "socialgraph.secretEnv" (list $src "admin-token" "SG_AUTH__ADMIN_TOKEN") }}
{{- include "socialgraph.secretEnv" (list $src "admin-token" "SG_RELATION__ADMIN_TOKEN") }}
{{- include "socialgraph.secretEnv" (list $src "page-token-secret" "SG_AUTH__PAGE_TOKEN_SECRET") }}
{{- end -}}

{{- define "socialgraph.secretNames.counter" -}}
{{- toJson (list "counter-redis-url" "kafka-brokers" "admin-token") -}}
{{- end -}}
{{- define "socialgraph.secretEnvs.counter" -}}
{{- $src := include "socialgraph.secretSources" .root | fromYaml -}}
{{- include "socialgraph.secretEnv" (list $src "counter-redis-url" "SG_REDIS__URL") }}
{{- include "socialgraph.secretEnv" (list $src "kafka-brokers" "SG_KAFKA__BROKERS") }}
{{- include "socialgraph.secretEnv" (list $src "admin-token" "SG_AUTH__ADMIN_TOKEN") }}
{{- end -}}

{{- /* message-svc has no admin RPC: no admin token. */ -}}
{{- define "socialgraph.secretNames.message" -}}
{{- toJson (list "message-database-url" "kafka-brokers" "page-token-secret") -}}
{{- end -}}
{{- define "socialgraph.secretEnvs.message" -}}
{{- $src := include "socialgraph.secretSources" .root | fromYaml -}}
{{- include "socialgraph.secretEnv" (list $src "message-database-url" "SG_DATABASE__URL") }}
{{- include "socialgraph.secretEnv" (list $src "kafka-brokers" "SG_KAFKA__BROKERS") }}
{{- include "socialgraph.secretEnv" (list $src "page-token-secret" "SG_AUTH__PAGE_TOKEN_SECRET") }}
{{- end -}}

{{- define "socialgraph.secretNames.gateway" -}}
{{- toJson (list) -}}
{{- end -}}
{{- /* The gateway holds no secret: callers' authorization headers are passed on to the services. */ -}}
{{- define "socialgraph.secretEnvs.gateway" -}}
{{- end -}}
