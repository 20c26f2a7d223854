{{/* Labels every object carries. */}}
{{- define "ichor.labels" -}}
app.kubernetes.io/name: ichor
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The selector labels of one component. */}}
{{- define "ichor.selector" -}}
app.kubernetes.io/name: ichor
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* An image reference. */}}
{{- define "ichor.image" -}}
{{ .root.Values.image.repository }}/{{ .name }}:{{ .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end -}}

{{/* The pod and container security context of both components. */}}
{{- define "ichor.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}
{{- define "ichor.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/*
The documents of a generated multi-document file under files/, one source with config/:
namespaced objects move to the release namespace.
*/}}
{{- define "ichor.generated" -}}
{{- range $text := splitList "\n---\n" (.root.Files.Get .file) }}
{{- $doc := fromYaml $text }}
{{- if $doc }}
{{- if and $doc.metadata (hasKey $doc.metadata "namespace") }}
{{- $_ := set $doc.metadata "namespace" $.root.Release.Namespace }}
{{- end }}
{{- $_ := set $doc.metadata "labels" (fromYaml (include "ichor.labels" $.root)) }}
---
{{ toYaml $doc }}
{{- end }}
{{- end }}
{{- end -}}
