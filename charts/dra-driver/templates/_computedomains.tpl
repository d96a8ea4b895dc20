{{/* ComputeDomains (docs/compute-domains.md): names shared by the templates. */}}
{{- define "dra-driver.computeDomainDriver" -}}compute-domain.gpu.dra.dev{{- end }}
{{- define "dra-driver.computeDomainPluginDir" -}}
{{- printf "%s/plugins/compute-domain.gpu.dra.dev" (trimSuffix "/" .Values.kubeletDir) }}
{{- end }}
{{- define "dra-driver.computeDomainDaemonName" -}}
{{- printf "%s-compute-domain-daemon" (include "dra-driver.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
