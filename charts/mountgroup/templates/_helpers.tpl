{{/* An image reference: repository:tag, the chart's appVersion where tag is empty. */}}
{{- define "mountgroup.image" -}}
{{- $tag := .image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end -}}

{{/* The labels every object of the release carries beside deploy/'s own. */}}
{{- define "mountgroup.chartLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* A container's image and pull policy. */}}
{{- define "mountgroup.imageFields" -}}
image: {{ include "mountgroup.image" . }}
imagePullPolicy: {{ .image.pullPolicy }}
{{- end -}}
