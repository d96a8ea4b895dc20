{{/* Names: DNS labels, so at most 63 characters. */}}
{{- define "dra-driver.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dra-driver.fullname" -}}
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

{{/* Prefix for the kubelet plugin's objects; leaves room for the "-kubelet-plugin" suffix. */}}
{{- define "dra-driver.pluginName" -}}
{{- printf "%s-kubelet-plugin" (include "dra-driver.fullname" . | trunc 47 | trimSuffix "-") }}
{{- end }}

{{- define "dra-driver.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dra-driver.labels" -}}
helm.sh/chart: {{ include "dra-driver.chart" . }}
{{ include "dra-driver.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "dra-driver.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-driver.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "dra-driver.pluginSelectorLabels" -}}
{{ include "dra-driver.selectorLabels" . }}
app.kubernetes.io/component: kubelet-plugin
{{- end }}

{{/*
The ONE place that names the plugin's service account: the DaemonSet, the ClusterRoleBinding and the
admission policy's username all use it, so the policy can never drift away from the account it guards.
*/}}
{{- define "dra-driver.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dra-driver.pluginName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false: name the existing ServiceAccount the plugin should run as" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Kubernetes username of that service account, as the API server sees it in requests. */}}
{{- define "dra-driver.serviceAccountUsername" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "dra-driver.serviceAccountName" .) }}
{{- end }}

{{- define "dra-driver.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "dra-driver.fakeNvml" -}}
{{- if hasPrefix "fake:" .Values.nvml }}true{{ end }}
{{- end }}

{{/* Paths on the node (the container sees the kubelet directories at the same paths). */}}
{{- define "dra-driver.registryDir" -}}
{{- printf "%s/plugins_registry" (trimSuffix "/" .Values.kubeletDir) }}
{{- end }}

{{- define "dra-driver.pluginDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubeletDir) .Values.driverName }}
{{- end }}

{{/*
The --nvml value. For fake GPUs, unless the user chose them:
  seed=$(DRA_DRIVER_NODE_NAME)  every node gets its own GPU UUIDs (Kubernetes expands $(VAR) from earlier env);
  state=<plugin dir>/fake-nvml-state.json  fake MIG instances survive a plugin restart, as on hardware.
*/}}
{{- define "dra-driver.nvmlSpec" -}}
{{- $spec := .Values.nvml }}
{{- if hasPrefix "fake:" $spec }}
{{- if not (regexMatch ",\\s*seed=" $spec) }}
{{- $spec = printf "%s,seed=$(DRA_DRIVER_NODE_NAME)" $spec }}
{{- end }}
{{- if not (regexMatch ",\\s*state=" $spec) }}
{{- $spec = printf "%s,state=%s/fake-nvml-state.json" $spec (include "dra-driver.pluginDir" .) }}
{{- end }}
{{- end }}
{{- $spec }}
{{- end }}

{{/* The controller's objects (Deployment, ServiceAccount, ClusterRole, binding). */}}
{{- define "dra-driver.controllerName" -}}
{{- printf "%s-controller" (include "dra-driver.fullname" . | trunc 52 | trimSuffix "-") }}
{{- end }}

{{- define "dra-driver.webhookSecretName" -}}
{{- if eq .Values.webhook.tls.mode "secret" }}{{ required "webhook.tls.secretName is required with webhook.tls.mode: secret" .Values.webhook.tls.secretName }}{{ else }}{{ printf "%s-webhook-tls" (include "dra-driver.controllerName" .) }}{{ end }}
{{- end }}
