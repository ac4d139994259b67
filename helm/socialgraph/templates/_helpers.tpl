{{/*
Names, labels, the image, and where each secret value comes from.
A "component" context is a dict: {root: $, name: "relation", svc: .Values.relation}.
*/}}

{{/* Prefix of every object name: fullnameOverride or the release name. */}}
{{- define "socialgraph.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "socialgraph.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of a component's objects: <prefix>-relation. Argument: component context. */}}
{{- define "socialgraph.componentName" -}}
{{- printf "%s-%s" (include "socialgraph.fullname" .root) .name -}}
{{- end -}}

{{/* Labels of every object. Argument: root context. */}}
{{- define "socialgraph.labels" -}}
helm.sh/chart: {{ include "socialgraph.chart" . }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: socialgraph
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of a component. Argument: component context. */}}
{{- define "socialgraph.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .name }}
{{- end -}}

{{/* All labels of a component's objects. Argument: component context. */}}
{{- define "socialgraph.componentLabels" -}}
{{ include "socialgraph.labels" .root }}
app.kubernetes.io/component: {{ .name }}
{{- end -}}

{{- define "socialgraph.image" -}}
{{- $img := .Values.image -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{- define "socialgraph.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-socialgraph" (include "socialgraph.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Listen address host:port; IPv6 hosts are bracketed. Argument: (list $ port). */}}
{{- define "socialgraph.listenAddr" -}}
{{- $host := (index . 0).Values.listenHost -}}
{{- if contains ":" $host -}}
{{- printf "[%s]:%d" $host (index . 1 | int64) -}}
{{- else -}}
{{- printf "%s:%d" $host (index . 1 | int64) -}}
{{- end -}}
{{- end -}}

{{/* Name of the Secret the chart creates for inline (trial) connection settings. */}}
{{- define "socialgraph.inlineSecretName" -}}
{{- printf "%s-socialgraph-inline" (include "socialgraph.fullname" .) -}}
{{- end -}}

{{/*
The sources of every secret value: a dict name -> {secret, key, inline}. `secret` empty means the
value is unset. `inline` is the value the chart must store itself (empty when an existing Secret is
named: the inline value is then never rendered).
*/}}
{{- define "socialgraph.secretSources" -}}
{{- $inline := include "socialgraph.inlineSecretName" . -}}
{{- $v := .Values -}}
{{- $out := dict -}}
{{- /* database: relation-svc's, and projection-svc's unless it has its own */ -}}
{{- if $v.database.existingSecret -}}
{{- $_ := set $out "database-url" (dict "secret" $v.database.existingSecret "key" $v.database.existingSecretKey "inline" "") -}}
{{- else -}}
{{- $_ := set $out "database-url" (dict "secret" $inline "key" "database-url" "inline" $v.database.url) -}}
{{- end -}}
{{- $pdb := $v.projection.database -}}
{{- if $pdb.existingSecret -}}
{{- $_ := set $out "projection-database-url" (dict "secret" $pdb.existingSecret "key" $pdb.existingSecretKey "inline" "" "own" true) -}}
{{- else if $pdb.url -}}
{{- $_ := set $out "projection-database-url" (dict "secret" $inline "key" "projection-database-url" "inline" $pdb.url "own" true) -}}
{{- else -}}
{{- $_ := set $out "projection-database-url" (merge (dict "own" false) (get $out "database-url")) -}}
{{- end -}}
{{- /* message-svc's: relation-svc's unless it has its own */ -}}
{{- $mdb := $v.message.database -}}
{{- if $mdb.existingSecret -}}
{{- $_ := set $out "message-database-url" (dict "secret" $mdb.existingSecret "key" $mdb.existingSecretKey "inline" "" "own" true) -}}
{{- else if $mdb.url -}}
{{- $_ := set $out "message-database-url" (dict "secret" $inline "key" "message-database-url" "inline" $mdb.url "own" true) -}}
{{- else -}}
{{- $_ := set $out "message-database-url" (merge (dict "own" false) (get $out "database-url")) -}}
{{- end -}}
{{- /* redis: relation-svc's, and counter-svc's unless it has its own */ -}}
{{- if $v.redis.existingSecret -}}
{{- $_ := set $out "redis-url" (dict "secret" $v.redis.existingSecret "key" $v.redis.existingSecretKey "inline" "") -}}
{{- else -}}
{{- $_ := set $out "redis-url" (dict "secret" $inline "key" "redis-url" "inline" $v.redis.url) -}}
{{- end -}}
{{- $cr := $v.counter.redis -}}
{{- if $cr.existingSecret -}}
{{- $_ := set $out "counter-redis-url" (dict "secret" $cr.existingSecret "key" $cr.existingSecretKey "inline" "") -}}
{{- else if $cr.url -}}
{{- $_ := set $out "counter-redis-url" (dict "secret" $inline "key" "counter-redis-url" "inline" $cr.url) -}}
{{- else -}}
{{- $_ := set $out "counter-redis-url" (get $out "redis-url") -}}
{{- end -}}
{{- /* cache redis: relation-svc's and projection-svc's list caches; unset (caches off) when empty */ -}}
{{- $cache := $v.cache -}}
{{- if $cache.existingSecret -}}
{{- $_ := set $out "cache-redis-url" (dict "secret" $cache.existingSecret "key" $cache.existingSecretKey "inline" "") -}}
{{- else if $cache.url -}}
{{- $_ := set $out "cache-redis-url" (dict "secret" $inline "key" "cache-redis-url" "inline" $cache.url) -}}
{{- else -}}
{{- $_ := set $out "cache-redis-url" (dict "secret" "" "key" "" "inline" "") -}}
{{- end -}}
{{- /* kafka brokers: only when taken from an existing Secret (inline brokers are not secret) */ -}}
{{- if $v.kafka.existingSecret -}}
{{- $_ := set $out "kafka-brokers" (dict "secret" $v.kafka.existingSecret "key" $v.kafka.existingSecretKey "inline" "") -}}
{{- else -}}
{{- $_ := set $out "kafka-brokers" (dict "secret" "" "key" "" "inline" "") -}}
{{- end -}}
{{- /* auth */ -}}
{{- $a := $v.auth -}}
{{- if $a.existingSecret -}}
{{- $_ := set $out "admin-token" (dict "secret" (ternary $a.existingSecret "" (ne $a.adminTokenKey "")) "key" $a.adminTokenKey "inline" "") -}}
{{- $_ := set $out "page-token-secret" (dict "secret" (ternary $a.existingSecret "" (ne $a.pageTokenSecretKey "")) "key" $a.pageTokenSecretKey "inline" "") -}}
{{- else -}}
{{- $_ := set $out "admin-token" (dict "secret" (ternary $inline "" (ne $a.adminToken "")) "key" "admin-token" "inline" $a.adminToken) -}}
{{- $_ := set $out "page-token-secret" (dict "secret" (ternary $inline "" (ne $a.pageTokenSecret "")) "key" "page-token-secret" "inline" $a.pageTokenSecret) -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
The data of the chart's inline Secret: only values no existing Secret covers, and only those a
deployed component uses. Yields a YAML map key -> plain value (possibly empty).
*/}}
{{- define "socialgraph.inlineSecretData" -}}
{{- $src := include "socialgraph.secretSources" . | fromYaml -}}
{{- $inline := include "socialgraph.inlineSecretName" . -}}
{{- $out := dict -}}
{{- $unused := list -}}
{{- if not .Values.projection.enabled }}{{ $unused = append $unused "projection-database-url" }}{{ end -}}
{{- if not .Values.counter.enabled }}{{ $unused = append $unused "counter-redis-url" }}{{ end -}}
{{- if not .Values.message.enabled }}{{ $unused = append $unused "message-database-url" }}{{ end -}}
{{- range $name, $s := $src -}}
{{- if and (eq $s.secret $inline) $s.inline (not (has $name $unused)) -}}
{{- $_ := set $out $s.key $s.inline -}}
{{- end -}}
{{- end -}}
{{- if $out }}{{ toYaml $out }}{{ end -}}
{{- end -}}

{{/*
An env entry read from a Secret. Argument: (list $sources "database-url" "SG_DATABASE__URL").
Renders nothing when the value is unset.
*/}}
{{- define "socialgraph.secretEnv" -}}
{{- $s := get (index . 0) (index . 1) -}}
{{- if $s.secret }}
- name: {{ index . 2 }}
  valueFrom:
    secretKeyRef:
      name: {{ $s.secret }}
      key: {{ $s.key }}
{{- end -}}
{{- end -}}

{{/*
Checksum of the inline secret values a component reads, so that changing one rolls its pods.
Argument: (list $ "database-url" "redis-url" ...).
*/}}
{{- define "socialgraph.secretChecksum" -}}
{{- $root := index . 0 -}}
{{- $src := include "socialgraph.secretSources" $root | fromYaml -}}
{{- $used := list -}}
{{- range $name := rest . -}}
{{- $s := get $src $name -}}
{{- $used = append $used (list $name $s.secret $s.key $s.inline) -}}
{{- end -}}
{{- toJson $used | sha256sum -}}
{{- end -}}

{{/* Names of the deployed components (the services, then the gateway), as a JSON list. */}}
{{- define "socialgraph.components" -}}
{{- $out := list "relation" -}}
{{- if .Values.projection.enabled }}{{ $out = append $out "projection" }}{{ end -}}
{{- if .Values.counter.enabled }}{{ $out = append $out "counter" }}{{ end -}}
{{- if .Values.message.enabled }}{{ $out = append $out "message" }}{{ end -}}
{{- if .Values.gateway.enabled }}{{ $out = append $out "gateway" }}{{ end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
Name of the port a component serves its callers on: "http" (HTTP/JSON) for the gateway, "grpc"
for the services. Argument: component context.
*/}}
{{- define "socialgraph.servingPort" -}}
{{- if eq .name "gateway" }}http{{ else }}grpc{{ end -}}
{{- end -}}

{{/* The binary a component runs (in /usr/local/bin): gateway, or <name>-svc. Argument: component context. */}}
{{- define "socialgraph.binary" -}}
{{- if eq .name "gateway" }}gateway{{ else }}{{ .name }}-svc{{ end -}}
{{- end -}}

{{/*
In-cluster gRPC URL of one of this release's services, http://<prefix>-<name>:<grpc port>.
Argument: (list $ "relation").
*/}}
{{- define "socialgraph.serviceUrl" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- printf "http://%s:%d" (include "socialgraph.componentName" (dict "root" $root "name" $name)) ((index $root.Values $name).ports.grpc | int64) -}}
{{- end -}}

{{/* An int-or-string value: "50%" stays a string, 1 an integer. */}}
{{- define "socialgraph.intOrString" -}}
{{- if kindIs "string" . }}{{ . | quote }}{{ else }}{{ . | int64 }}{{ end -}}
{{- end -}}

{{/*
The HorizontalPodAutoscaler of a Deployment (relation-svc, message-svc, the gateway), from
<component>.autoscaling.
Argument: component context.
*/}}
{{- define "socialgraph.hpa" -}}
{{- $a := .svc.autoscaling -}}
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ include "socialgraph.componentName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "socialgraph.componentLabels" . | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ include "socialgraph.componentName" . }}
  minReplicas: {{ $a.minReplicas | int64 }}
  maxReplicas: {{ $a.maxReplicas | int64 }}
  metrics:
    {{- with $a.targetCPUUtilizationPercentage }}
    - type: Resource
      resource:
        name: cpu
        target:
          type: Utilization
          averageUtilization: {{ . | int64 }}
    {{- end }}
    {{- with $a.targetMemoryUtilizationPercentage }}
    - type: Resource
      resource:
        name: memory
        target:
          type: Utilization
          averageUtilization: {{ . | int64 }}
    {{- end }}
  {{- with $a.behavior }}
  behavior:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/*
PromQL label matchers of the series of some of this release's components, as the chart's
ServiceMonitors label them: namespace="<release namespace>", service="<prefix>-<name>" (one
component) or service=~"<prefix>-a|<prefix>-b" (several). Argument: (list $ "relation" ...).
*/}}
{{- define "socialgraph.promSelector" -}}
{{- $root := index . 0 -}}
{{- $names := list -}}
{{- range $name := rest . -}}
{{- $names = append $names (include "socialgraph.componentName" (dict "root" $root "name" $name)) -}}
{{- end -}}
{{- if eq (len $names) 1 -}}
namespace="{{ $root.Release.Namespace }}", service="{{ first $names }}"
{{- else -}}
namespace="{{ $root.Release.Namespace }}", service=~"{{ join "|" $names }}"
{{- end -}}
{{- end -}}
