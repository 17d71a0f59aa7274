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
