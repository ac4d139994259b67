{{/*
Seconds a pod may take to stop: the preStop sleep, the drain of in-flight requests
(server.drainTimeoutMs, the gateway's http.drainTimeoutMs; rounded up), and a margin for the
relay, consumers and telemetry. Argument: component values (.Values.relation, ...).
*/}}
{{- define "socialgraph.terminationGracePeriodSeconds" -}}
{{- $drainMs := 0 -}}
{{- if .server }}{{ $drainMs = .server.drainTimeoutMs }}{{ else }}{{ $drainMs = .http.drainTimeoutMs }}{{ end -}}
{{- $drainSecs := div (add (int64 $drainMs) 999) 1000 -}}
{{- add (int64 .preStopSleepSeconds) $drainSecs (int64 .terminationGraceExtraSeconds) -}}
{{- end -}}

{{/* A native gRPC probe (grpc.health.v1). Argument: (list port settings). */}}
{{- define "socialgraph.grpcProbe" -}}
{{- $p := index . 1 -}}
grpc:
  port: {{ index . 0 | int64 }}
periodSeconds: {{ $p.periodSeconds | int64 }}
timeoutSeconds: {{ $p.timeoutSeconds | int64 }}
failureThreshold: {{ $p.failureThreshold | int64 }}
{{- with $p.initialDelaySeconds }}
initialDelaySeconds: {{ . | int64 }}
{{- end }}
{{- end -}}

{{/* An HTTP GET probe (the gateway's admin port). Argument: (list port path settings). */}}
{{- define "socialgraph.httpProbe" -}}
{{- $p := index . 2 -}}
httpGet:
  port: {{ index . 0 | int64 }}
  path: {{ index . 1 }}
  scheme: HTTP
periodSeconds: {{ $p.periodSeconds | int64 }}
timeoutSeconds: {{ $p.timeoutSeconds | int64 }}
failureThreshold: {{ $p.failureThreshold | int64 }}
{{- with $p.initialDelaySeconds }}
initialDelaySeconds: {{ . | int64 }}
{{- end }}
{{- end -}}

{{/*
The pod template of a component. Argument: component context with, for StatefulSet consumers,
"consumer": true (adds the partition assignment from the pod ordinal). The services serve gRPC
and are probed over grpc.health.v1; the gateway serves HTTP/JSON and is probed on its admin
port (/live, /ready).
*/}}
{{- define "socialgraph.podTemplate" -}}
{{- $root := .root -}}
{{- $svc := .svc -}}
{{- $secretNames := include (printf "socialgraph.secretNames.%s" .name) . | fromJsonArray -}}
{{- $serving := include "socialgraph.servingPort" . -}}
{{- $secretEnv := include (printf "socialgraph.secretEnvs.%s" .name) . | trim -}}
metadata:
  labels:
    {{- include "socialgraph.componentLabels" . | nindent 4 }}
    {{- with $svc.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include (printf "socialgraph.configData.%s" .name) . | sha256sum }}
    checksum/secret: {{ include "socialgraph.secretChecksum" (concat (list $root) $secretNames) }}
    {{- with $svc.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "socialgraph.serviceAccountName" $root }}
  automountServiceAccountToken: false
  # The services read SG_* variables and refuse unknown ones: no Docker-link variables
  # (a release named "sg" would otherwise inject SG_RELATION_SERVICE_HOST and the like).
  enableServiceLinks: false
  terminationGracePeriodSeconds: {{ include "socialgraph.terminationGracePeriodSeconds" $svc }}
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $svc.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  securityContext:
    {{- toYaml $root.Values.podSecurityContext | nindent 4 }}
  containers:
    - name: {{ .name }}
      image: {{ include "socialgraph.image" $root }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      command: ["/usr/local/bin/{{ include "socialgraph.binary" . }}"]
      args: ["serve"]
      ports:
        - name: {{ $serving }}
          containerPort: {{ index $svc.ports $serving | int64 }}
          protocol: TCP
        - name: admin
          containerPort: {{ $svc.ports.admin | int64 }}
          protocol: TCP
      envFrom:
        - configMapRef:
            name: {{ include "socialgraph.componentName" . }}
      {{- if or .consumer $secretEnv $svc.extraEnv }}
      env:
        {{- if .consumer }}
        # This replica consumes the partitions p with p % COUNT == ORDINAL.
        - name: SG_CONSUMER__PARTITIONS__REPLICA__ORDINAL
          valueFrom:
            fieldRef:
              fieldPath: metadata.labels['apps.kubernetes.io/pod-index']
        - name: SG_CONSUMER__PARTITIONS__REPLICA__COUNT
          value: {{ $svc.replicas | int64 | quote }}
        {{- end }}
        {{- with $secretEnv }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with $svc.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      {{- if eq $serving "http" }}
      # Startup and liveness: the process answers on its admin port; readiness: /ready (200
      # only while serving).
      startupProbe:
        {{- include "socialgraph.httpProbe" (list $svc.ports.admin "/live" $svc.probes.startup) | nindent 8 }}
      livenessProbe:
        {{- include "socialgraph.httpProbe" (list $svc.ports.admin "/live" $svc.probes.liveness) | nindent 8 }}
      readinessProbe:
        {{- include "socialgraph.httpProbe" (list $svc.ports.admin "/ready" $svc.probes.readiness) | nindent 8 }}
      {{- else }}
      startupProbe:
        {{- include "socialgraph.grpcProbe" (list $svc.ports.grpc $svc.probes.startup) | nindent 8 }}
      livenessProbe:
        {{- include "socialgraph.grpcProbe" (list $svc.ports.grpc $svc.probes.liveness) | nindent 8 }}
      readinessProbe:
        {{- include "socialgraph.grpcProbe" (list $svc.ports.grpc $svc.probes.readiness) | nindent 8 }}
      {{- end }}
      {{- if gt (int64 $svc.preStopSleepSeconds) 0 }}
      lifecycle:
        preStop:
          sleep:
            seconds: {{ $svc.preStopSleepSeconds | int64 }}
      {{- end }}
      resources:
        {{- toYaml $svc.resources | nindent 8 }}
      securityContext:
        {{- toYaml $root.Values.containerSecurityContext | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: {{ $root.Values.tmpSizeLimit }}
  {{- with $svc.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $svc.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $svc.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  topologySpreadConstraints:
    {{- if $svc.topologySpreadConstraints }}
    {{- toYaml $svc.topologySpreadConstraints | nindent 4 }}
    {{- else }}
    - maxSkew: 1
      topologyKey: kubernetes.io/hostname
      whenUnsatisfiable: ScheduleAnyway
      labelSelector:
        matchLabels:
          {{- include "socialgraph.selectorLabels" . | nindent 10 }}
    {{- end }}
{{- end -}}
