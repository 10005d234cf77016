{{/* Names, labels and small shared pieces of the tiergate chart. */}}

{{- define "tiergate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's base name; every object name starts with it (truncated for DNS-1123 labels). */}}
{{- define "tiergate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tiergate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "tiergate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tiergate
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: (list $ "gateway") */}}
{{- define "tiergate.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "tiergate.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "tiergate.gateway.name" -}}
{{- include "tiergate.fullname" . }}-gateway
{{- end }}

{{- define "tiergate.redis.name" -}}
{{- include "tiergate.fullname" . }}-redis
{{- end }}

{{- define "tiergate.secret.name" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "tiergate.fullname" .)) }}
{{- end }}

{{- define "tiergate.policy.configmap" -}}
{{- .Values.policy.existingConfigMap | default (printf "%s-policy" (include "tiergate.fullname" .)) }}
{{- end }}

{{/* A vLLM pool's object name: (list $ "pool-name"); the pool's kubernetes.name overrides the pool name. */}}
{{- define "tiergate.vllm.name" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- $override := "" -}}
{{- range $root.Values.vllm.pools }}
{{- if and (eq .name $name) .kubernetes .kubernetes.name }}{{ $override = .kubernetes.name }}{{ end }}
{{- end }}
{{- $override | default (printf "%s-%s" (include "tiergate.fullname" $root) $name) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The headless Service DNS name of a vLLM pool, for the policy's discovery.dns: (list $ "pool-name") */}}
{{- define "tiergate.vllm.dns" -}}
{{- $root := index . 0 -}}
{{- printf "%s.%s.svc.cluster.local" (include "tiergate.vllm.name" .) $root.Release.Namespace }}
{{- end }}

{{/* The gateway's environment variable holding a vLLM pool's API key, for the policy tier's api_key_env:
VLLM_API_KEY_<POOL NAME>, e.g. VLLM_API_KEY_LLAMA_70B for pool llama-70b. Argument: the pool name. */}}
{{- define "tiergate.vllm.keyEnv" -}}
{{- printf "VLLM_API_KEY_%s" (. | upper | replace "-" "_") }}
{{- end }}

{{/* Whether the gateway reads tenants from keys.yaml in the Secret. */}}
{{- define "tiergate.hasKeysFile" -}}
{{- if or .Values.secrets.apiKeysFile .Values.secrets.existingSecret }}true{{ end }}
{{- end }}

{{/* A vLLM pod spec: (list $ pool container); volumes and scheduling as cloud_pool.render._pod_spec. */}}
{{- define "tiergate.vllm.pod" -}}
{{- $ := index . 0 }}{{- $p := index . 1 }}{{- $container := index . 2 }}
{{- $k := $p.kubernetes | default dict }}{{- $cache := $k.model_cache | default dict }}
terminationGracePeriodSeconds: 60
automountServiceAccountToken: false
{{- with $.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
containers:
  {{- toYaml (list $container) | nindent 2 }}
volumes:
  {{- if $cache.claim }}
  - name: model-cache
    persistentVolumeClaim: {claimName: {{ $cache.claim }}}
  {{- else }}
  - name: model-cache
    emptyDir: {}
  {{- end }}
  # NCCL and vLLM's workers share tensors through /dev/shm; the container default (64Mi) is far too small.
  - name: dshm
    emptyDir: {medium: Memory, sizeLimit: {{ $k.shm_size | default "16Gi" }}}
{{- with $k.node_selector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $.Values.vllm.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
