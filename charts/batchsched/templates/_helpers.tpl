{{/*
The release's full name: the name of every object (the release's name where it holds
"batchsched", so `helm install batchsched` makes the same names as manifests/base/).
*/}}
{{- define "batchsched.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "batchsched.selectorLabels" -}}
app.kubernetes.io/name: batchsched
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "batchsched.labels" -}}
{{ include "batchsched.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "batchsched.leaseName" -}}
{{- .Values.leaderElection.leaseName | default (include "batchsched.fullname" .) -}}
{{- end -}}

{{- define "batchsched.leaseNamespace" -}}
{{- .Values.leaderElection.namespace | default .Release.Namespace -}}
{{- end -}}

{{/*
The documents of a file of files/ (links to manifests/), parsed: {"docs": [...]}.
*/}}
{{- define "batchsched.documents" -}}
{{- $docs := list -}}
{{- range regexSplit "(?m)^---[ \t]*$" (.root.Files.Get .file) -1 -}}
{{- $doc := fromYaml . -}}
{{- if $doc -}}
{{- $docs = append $docs $doc -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "docs" $docs) -}}
{{- end -}}

{{/*
The rules of a ClusterRole (or, with "kind", a Role) of manifests/base/rbac.yaml, by name:
the chart grants exactly what the kustomize base grants, from the same file.
*/}}
{{- define "batchsched.baseRules" -}}
{{- $kind := .kind | default "ClusterRole" -}}
{{- $found := list -}}
{{- range (include "batchsched.documents" (dict "root" .root "file" "files/rbac.yaml") | fromYaml).docs -}}
{{- if and (eq .kind $kind) (eq .metadata.name $.name) -}}
{{- $found = .rules -}}
{{- end -}}
{{- end -}}
{{- if not $found -}}
{{- fail (printf "files/rbac.yaml has no %s %s" $kind .name) -}}
{{- end -}}
{{- toYaml $found -}}
{{- end -}}

{{/*
The configuration file: .Values.config with schedulerNames, leaderElection,
metricsAddress, explain.address and explain.tls from their own values.
*/}}
{{- define "batchsched.config" -}}
{{- range $key := list "schedulerNames" "leaderElection" "metricsAddress" -}}
{{- if hasKey $.Values.config $key -}}
{{- fail (printf "set %s through its own value, not config.%s (see values.yaml)" $key $key) -}}
{{- end -}}
{{- end -}}
{{- range $key := list "address" "tls" -}}
{{- if hasKey ($.Values.config.explain | default dict) $key -}}
{{- fail (printf "set explain.%s through the value views, not config.explain.%s (see values.yaml)" $key $key) -}}
{{- end -}}
{{- end -}}
{{- $tls := .Values.views.tls -}}
{{- if and $tls.secretName (not $tls.serverName) -}}
{{- fail "views.tls.serverName: name one of the certificate's dnsNames (clients check it for that name)" -}}
{{- end -}}
{{- $le := .Values.leaderElection -}}
{{- $config := deepCopy .Values.config -}}
{{- $_ := set $config "schedulerNames" .Values.schedulerNames -}}
{{- $_ := set $config "leaderElection" (dict
      "enabled" $le.enabled
      "namespace" (include "batchsched.leaseNamespace" .)
      "leaseName" (include "batchsched.leaseName" .)
      "leaseDurationSeconds" $le.leaseDurationSeconds
      "renewDeadlineSeconds" $le.renewDeadlineSeconds
      "retryPeriodSeconds" $le.retryPeriodSeconds) -}}
{{- $_ := set $config "metricsAddress" (printf "%s:%v" .Values.metrics.bindAddress .Values.metrics.port) -}}
{{- $explain := $config.explain | default dict -}}
{{- $_ := set $explain "address" (printf "%s:%v" .Values.views.bindAddress .Values.views.port) -}}
{{- if $tls.secretName -}}
{{- $_ := set $explain "tls" (dict
      "certFile" "/etc/batchsched-tls/tls.crt" "keyFile" "/etc/batchsched-tls/tls.key"
      "caFile" "/etc/batchsched-tls/ca.crt" "serverName" $tls.serverName) -}}
{{- end -}}
{{- $_ := set $config "explain" $explain -}}
{{- toYaml $config -}}
{{- end -}}
