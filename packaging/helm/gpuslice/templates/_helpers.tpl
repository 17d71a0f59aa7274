{{/* The image of every gpuslice container. */}}
{{- define "gpuslice.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{/* The webhook's Service name and the DNS name its certificate names. */}}
{{- define "gpuslice.webhookService" -}}
gpuslice-webhook
{{- end }}
{{- define "gpuslice.webhookDNS" -}}
{{ include "gpuslice.webhookService" . }}.{{ .Values.namespace }}.svc
{{- end }}
{{- define "gpuslice.webhookSecret" -}}
gpuslice-webhook-tls
{{- end }}

{{/* The node config, config.toml of the ConfigMap gpuslice-config (installer.yaml): the
`config` value and the [dra] keys of dra.mode and dra.slotsPerGpu. One definition, so the
pod templates' checksum/config is the digest of exactly what the ConfigMap holds. */}}
{{- define "gpuslice.configToml" -}}
{{ .Values.config }}
{{- $slots := int .Values.dra.slotsPerGpu }}
{{- if or (lt $slots 1) (gt $slots 128) }}
{{- fail (printf "dra.slotsPerGpu is %v; accepted: 1 to 128 (the plugin's dra.slots_per_gpu)" .Values.dra.slotsPerGpu) }}
{{- end }}
{{- if or .Values.dra.mode (ne $slots 6) }}
[dra]
{{- if .Values.dra.mode }}
mode = {{ .Values.dra.mode | quote }}
{{- end }}
{{- if ne $slots 6 }}
slots_per_gpu = {{ $slots }}
{{- end }}
{{- end }}
{{- end }}

{{/* The pod-template annotation that rolls a DaemonSet whose pods read the node config
(written to the host's /etc/gpuslice/config.toml by the installer) when the config changes:
a `helm upgrade` that changes only the ConfigMap would otherwise leave every pod on the old
one. */}}
{{- define "gpuslice.configChecksum" -}}
checksum/config: {{ include "gpuslice.configToml" . | sha256sum }}
{{- end }}
