{{/* The name of an object: the prefix plus its role. */}}
{{- define "csi-addons.name" -}}
{{ .root.Values.namePrefix }}{{ .name }}
{{- end -}}

{{/* Labels that select the manager's Pods (same as config/manager). */}}
{{- define "csi-addons.selectorLabels" -}}
app.kubernetes.io/name: csi-addons
control-plane: controller-manager
{{- end -}}

{{/* Labels Helm adds to every object so `helm` can tell its own. */}}
{{- define "csi-addons.chartLabels" -}}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "csi-addons.serviceAccount" -}}
{{ include "csi-addons.name" (dict "root" . "name" "controller-manager") }}
{{- end -}}
