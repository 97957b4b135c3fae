{{/*
Names, labels, the component table and the pod spec: the one place every template takes them from.
*/}}

{{- define "flashcoupon.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "flashcoupon.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The name of a component's objects: (dict "root" $ "component" "issuer") */}}
{{- define "flashcoupon.componentName" -}}
{{- printf "%s-%s" (include "flashcoupon.fullname" .root | trunc 50 | trimSuffix "-") .component }}
{{- end }}

{{- define "flashcoupon.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flashcoupon.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{/* Labels of every object: (dict "root" $ "component" "issuer"), component optional */}}
{{- define "flashcoupon.labels" -}}
{{ include "flashcoupon.selectorLabels" . }}
app.kubernetes.io/part-of: flashcoupon
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end }}

{{/* An image reference: (dict "root" $ "image" "issuer") */}}
{{- define "flashcoupon.image" -}}
{{- $images := .root.Values.images }}
{{- $image := index $images .image }}
{{- if $image.ref }}
{{- $image.ref }}
{{- else }}
{{- $repository := $image.repository }}
{{- with $images.registry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $repository }}
{{- end }}
{{- printf "%s:%s" $repository ($images.tag | default .root.Chart.AppVersion) }}
{{- end }}
{{- end }}

{{- define "flashcoupon.configName" -}}
{{- include "flashcoupon.fullname" . }}-endpoints
{{- end }}

{{- define "flashcoupon.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "flashcoupon.fullname" .)) }}
{{- end }}

{{/*
The components: the image each runs, its command (a console script of the workspace, or a
module), the port it serves (health, readiness, metrics), the data stores it needs and its
fixed environment. Values under .Values.<values> tune each one.
  http: serves /healthz, /readyz and /metrics on `port` (gets a Service, readiness, scraping)
  metricsPort: serves /metrics on a port of its own, container port `metrics` (gets a Service
    whose `http` port, the one the ServiceMonitor scrapes, leads there)
  job: runs to completion (the migration Job), not a Deployment
*/}}
{{- define "flashcoupon.components" -}}
{{- $fullname := include "flashcoupon.fullname" . }}
{{- $trusted := .Values.gateway.trustedProxies }}
{{- if kindIs "invalid" $trusted }}
{{- $trusted = ternary 1 0 .Values.ingress.enabled }}
{{- end }}
gateway:
  image: gateway
  command: [flashcoupon-gateway, --workers, {{ .Values.gateway.workers | quote }}]
  port: 8080
  http: true
  needs: [redis, gateway-auth]
  env:
    FLASHCOUPON_GATEWAY_HOST: 0.0.0.0
    FLASHCOUPON_GATEWAY_PORT: "8080"
    FLASHCOUPON_GATEWAY_ISSUER_URLS: {{ include "flashcoupon.issuerUrls" . | quote }}
    {{- if eq .Values.issuer.routing "perPod" }}
    # each shopper to the issuer pod their id hashes to: what perPod is for
    FLASHCOUPON_GATEWAY_ISSUER_ROUTING: shopper
    {{- end }}
    FLASHCOUPON_GATEWAY_WALLET_URL: http://{{ $fullname }}-wallet:8082
    FLASHCOUPON_GATEWAY_JWT_AUDIENCE: {{ .Values.gateway.auth.audience | quote }}
    FLASHCOUPON_GATEWAY_TRUSTED_PROXIES: {{ $trusted | quote }}
    {{- with .Values.gateway.auth.jwksUrl }}
    FLASHCOUPON_GATEWAY_JWKS_URL: {{ . | quote }}
    {{- end }}
issuer:
  image: issuer
  command: [flashcoupon-issuer]
  port: 8081
  http: true
  needs: [redis]
  env:
    FLASHCOUPON_ISSUER_HOST: 0.0.0.0
    FLASHCOUPON_ISSUER_PORT: "8081"
    FLASHCOUPON_ISSUER_DURABILITY: {{ .Values.issuer.durability | quote }}
relay:
  image: issuer
  command: [flashcoupon-relay]
  port: 8084
  http: true
  needs: [redis, kafka]
  env:
    FLASHCOUPON_RELAY_HOST: 0.0.0.0
    FLASHCOUPON_RELAY_PORT: "8084"
    # The relay publishes only what the issuer's durability promises (docs/relay.md).
    FLASHCOUPON_RELAY_DURABILITY: {{ .Values.issuer.durability | quote }}
persister:
  image: persister
  command: [flashcoupon-persister]
  port: 8083
  http: true
  needs: [kafka, mysql]
  env:
    FLASHCOUPON_PERSISTER_HOST: 0.0.0.0
    FLASHCOUPON_PERSISTER_PORT: "8083"
wallet:
  image: persister
  command: [flashcoupon-wallet]
  port: 8082
  http: true
  needs: [kafka, mysql]
  env:
    FLASHCOUPON_WALLET_HOST: 0.0.0.0
    FLASHCOUPON_WALLET_PORT: "8082"
operator:
  image: operator
  command: [python, -m, flashcoupon_operator]
  # kopf's liveness endpoint, the only thing kopf serves.
  port: 8085
  # prometheus_client's /metrics server, apart from kopf's (flashcoupon_operator.__main__).
  metricsPort: 8086
  needs: [redis, mysql]
  serviceAccountToken: true
  env:
    FLASHCOUPON_OPERATOR_LIVENESS: http://0.0.0.0:8085/healthz
    FLASHCOUPON_OPERATOR_METRICS_PORT: "8086"
    FLASHCOUPON_OPERATOR_NAMESPACE: {{ .Values.operator.watchNamespace | quote }}
    FLASHCOUPON_OPERATOR_REFRESH_SECONDS: {{ .Values.operator.refreshSeconds | quote }}
migrations:
  image: persister
  command: [flashcoupon-migrate, upgrade]
  needs: [mysql]
  job: true
  env: {}
{{- end }}

{{/*
The gateway's FLASHCOUPON_GATEWAY_ISSUER_URLS: the issuer Service, or with issuer.routing
perPod one URL per StatefulSet pod (stable DNS names through the headless Service), in pod
order, so every gateway maps a shopper to the same issuer.
*/}}
{{- define "flashcoupon.issuerUrls" -}}
{{- $issuer := include "flashcoupon.componentName" (dict "root" . "component" "issuer") }}
{{- if eq .Values.issuer.routing "perPod" }}
{{- $urls := list }}
{{- range $i := until (int .Values.issuer.replicas) }}
{{- $urls = append $urls (printf "http://%s-%d.%s-pods.%s.svc:8081" $issuer $i $issuer $.Release.Namespace) }}
{{- end }}
{{- join "," $urls }}
{{- else }}
{{- printf "http://%s:8081" $issuer }}
{{- end }}
{{- end }}

{{/* Environment variables a component gets for each data store it needs. */}}
{{- define "flashcoupon.storeEnv" -}}
{{- $config := include "flashcoupon.configName" .root }}
{{- $secret := include "flashcoupon.secretName" .root -}}
{{- range .needs }}
{{- if eq . "redis" }}
- name: FLASHCOUPON_REDIS_NODES
  valueFrom: {configMapKeyRef: {name: {{ $config }}, key: FLASHCOUPON_REDIS_NODES}}
{{- else if eq . "kafka" }}
- name: FLASHCOUPON_KAFKA_BOOTSTRAP
  valueFrom: {configMapKeyRef: {name: {{ $config }}, key: FLASHCOUPON_KAFKA_BOOTSTRAP}}
{{- else if eq . "mysql" }}
- name: FLASHCOUPON_MYSQL_URL
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: FLASHCOUPON_MYSQL_URL}}
{{- else if eq . "gateway-auth" }}
{{- if not $.root.Values.gateway.auth.jwksUrl }}
- name: FLASHCOUPON_GATEWAY_JWT_SECRET
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: FLASHCOUPON_GATEWAY_JWT_SECRET}}
{{- end }}
- name: FLASHCOUPON_GATEWAY_TICKET_SECRET
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: FLASHCOUPON_GATEWAY_TICKET_SECRET}}
{{- end }}
{{- end }}
{{- end }}

{{/*
The pod template of a component: (dict "root" $ "name" "issuer" "c" <its table entry>).
Hardened: non-root numeric user, read-only root file system (an emptyDir on /tmp), no
capabilities, no privilege escalation, RuntimeDefault seccomp, no API token unless needed.
*/}}
{{- define "flashcoupon.podTemplate" -}}
{{- $root := .root }}
{{- $c := .c }}
{{- $values := index $root.Values .name }}
{{- $pod := $root.Values.pod -}}
metadata:
  labels:
    {{- include "flashcoupon.labels" (dict "root" $root "component" .name) | nindent 4 }}
  annotations:
    # Roll the pods when an endpoint or a secret input changes.
    checksum/config: {{ include (print $root.Template.BasePath "/config.yaml") $root | sha256sum }}
    checksum/secret: {{ list $root.Values.mysql $root.Values.gateway.auth $root.Values.secrets | toJson | sha256sum }}
    {{- with $pod.annotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "flashcoupon.componentName" (dict "root" $root "component" (ternary "persister" .name (hasKey $c "job"))) }}
  automountServiceAccountToken: {{ hasKey $c "serviceAccountToken" }}
  {{- if $c.job }}
  restartPolicy: OnFailure
  {{- end }}
  terminationGracePeriodSeconds: {{ $pod.terminationGracePeriodSeconds }}
  securityContext:
    runAsNonRoot: true
    runAsUser: {{ $pod.uid }}
    runAsGroup: {{ $pod.uid }}
    fsGroup: {{ $pod.uid }}
    seccompProfile: {type: RuntimeDefault}
  {{- with $root.Values.images.pullSecrets }}
  imagePullSecrets:
    {{- range . }}
    - name: {{ . }}
    {{- end }}
  {{- end }}
  {{- with $pod.nodeSelector }}
  nodeSelector: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $pod.tolerations }}
  tolerations: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $pod.affinity }}
  affinity: {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ .name }}
      image: {{ include "flashcoupon.image" (dict "root" $root "image" $c.image) }}
      imagePullPolicy: {{ $root.Values.images.pullPolicy }}
      command: {{- toYaml $c.command | nindent 8 }}
      env:
        {{- include "flashcoupon.storeEnv" (dict "root" $root "needs" $c.needs) | trim | nindent 8 }}
        {{- range $key, $value := merge (dict) $values.env $c.env }}
        - name: {{ $key }}
          value: {{ $value | toString | quote }}
        {{- end }}
      {{- if $c.port }}
      ports:
        - name: http
          containerPort: {{ $c.port }}
          protocol: TCP
        {{- with $c.metricsPort }}
        - name: metrics
          containerPort: {{ . }}
          protocol: TCP
        {{- end }}
      livenessProbe:
        httpGet: {path: /healthz, port: http}
        periodSeconds: 10
        timeoutSeconds: 3
        failureThreshold: 3
      startupProbe:
        httpGet: {path: /healthz, port: http}
        periodSeconds: 2
        failureThreshold: 60
      {{- end }}
      {{- if $c.http }}
      readinessProbe:
        httpGet: {path: /readyz, port: http}
        periodSeconds: 5
        timeoutSeconds: 3
        failureThreshold: 2
      {{- if $pod.preStopSleepSeconds }}
      lifecycle:
        preStop:
          exec: {command: [sleep, {{ $pod.preStopSleepSeconds | quote }}]}
      {{- end }}
      {{- end }}
      resources: {{- toYaml $values.resources | nindent 8 }}
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities: {drop: [ALL]}
      volumeMounts:
        - {name: tmp, mountPath: /tmp}
  volumes:
    - name: tmp
      emptyDir: {sizeLimit: 64Mi}
{{- end }}
