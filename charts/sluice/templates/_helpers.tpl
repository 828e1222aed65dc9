{{/* Chart name, truncated to the 63 characters a label allows. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart> unless the release name already contains the chart name. */}}
{{- define "sluice.fullname" -}}
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

{{/* The headless admin Service (peers, metrics): <fullname>-admin. */}}
{{- define "sluice.adminServiceName" -}}
{{- printf "%s-admin" (include "sluice.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ include "sluice.chart" . }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sluice
{{- end }}

{{/* Labels that select the gateway pods (immutable once installed). */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sluice.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
The config file: values.config with the kubernetes: keys only the chart can know.
- gateway_service: the headless admin Service, whose EndpointSlices list the peer gateway
  pods with the port named "admin" (the leader merges their signals);
- lease.namespace: the release namespace (the namespaced Role grants the Lease there), and
  lease.name <fullname>-scaler unless set, so two releases in one namespace do not share it;
- ingress_class: ingressClass.name unless set;
- namespaces: [the release namespace] when rbac.clusterWide is false (a Role only).
*/}}
{{- define "sluice.config" -}}
{{- $config := deepCopy .Values.config }}
{{- $kube := get $config "kubernetes" | default dict }}
{{- $_ := set $kube "gateway_service" (dict "namespace" .Release.Namespace "name" (include "sluice.adminServiceName" .) "admin_port_name" "admin") }}
{{- $lease := get $kube "lease" | default dict }}
{{- $_ := set $lease "namespace" .Release.Namespace }}
{{- $_ := set $lease "name" (include "sluice.leaseName" .) }}
{{- $_ := set $kube "lease" $lease }}
{{- if not (hasKey $kube "ingress_class") }}
{{- $_ := set $kube "ingress_class" .Values.ingressClass.name }}
{{- end }}
{{- if not .Values.rbac.clusterWide }}
{{- $_ := set $kube "namespaces" (list .Release.Namespace) }}
{{- end }}
{{- $_ := set $config "kubernetes" $kube }}
{{- toYaml $config }}
{{- end }}

{{/*
Checks that make a broken install fail at render time instead of in a crash-looping pod.
*/}}
{{- define "sluice.validate" -}}
{{- $config := .Values.config }}
{{- range $plane := list "listen" "admin" }}
{{- $section := get $config $plane | default dict }}
{{- $host := get $section "host" | default "127.0.0.1" | toString }}
{{- if has $host (list "127.0.0.1" "localhost" "::1") }}
{{- fail (printf "config.%s.host is %s: a pod must bind a reachable address (0.0.0.0 or ::) for the Service and the probes" $plane $host) }}
{{- end }}
{{- if not (get $section "port") }}
{{- fail (printf "config.%s.port must be set to a fixed port (the chart uses it as the container port)" $plane) }}
{{- end }}
{{- end }}
{{- if ne (toString (get $config "platform")) "kubernetes" }}
{{- fail (printf "config.platform must be kubernetes in this chart, got %v" (get $config "platform")) }}
{{- end }}
{{- $kube := get $config "kubernetes" | default dict }}
{{- $class := get $kube "ingress_class" | default .Values.ingressClass.name }}
{{- if and .Values.ingressClass.enabled (ne $class .Values.ingressClass.name) }}
{{- fail (printf "ingressClass.name (%s) differs from config.kubernetes.ingress_class (%s): Sluice would ignore the Ingresses of the class the chart creates" .Values.ingressClass.name $class) }}
{{- end }}
{{- $namespaces := get $kube "namespaces" | default list }}
{{- if and (not .Values.rbac.clusterWide) $namespaces (ne (toJson $namespaces) (toJson (list .Release.Namespace))) }}
{{- fail (printf "config.kubernetes.namespaces is %v but rbac.clusterWide=false grants access to the release namespace (%s) only" $namespaces .Release.Namespace) }}
{{- end }}
{{- if and $config.admin.token_env (not .Values.adminToken.existingSecret) }}
{{- if not .Values.adminToken.value }}
{{- fail (printf "adminToken: set adminToken.existingSecret to a Secret you created (kubectl -n %s create secret generic sluice-admin-token --from-literal=%s=\"$(openssl rand -hex 32)\") or adminToken.value (>= 32 characters). The chart does not invent a token, so helm template and Argo CD render the same objects every time" .Release.Namespace .Values.adminToken.secretKey) }}
{{- end }}
{{- if lt (len .Values.adminToken.value) 32 }}
{{- fail (printf "adminToken.value must be at least 32 characters, got %d" (len .Values.adminToken.value)) }}
{{- end }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail (printf "autoscaling.minReplicas (%v) must not exceed autoscaling.maxReplicas (%v)" .Values.autoscaling.minReplicas .Values.autoscaling.maxReplicas) }}
{{- end }}
{{- if and .Values.autoscaling.enabled (not (dig "requests" "cpu" "" .Values.resources)) }}
{{- fail "autoscaling.enabled needs resources.requests.cpu: the HPA's target is a percentage of it" }}
{{- end }}
{{- $shutdown := get $config "shutdown" | default dict }}
{{- $drain := get $shutdown "drain_s" | default .Values.drainSeconds }}
{{- if le (float64 .Values.terminationGracePeriodSeconds) (addf .Values.preStopDelaySeconds $drain) }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed preStopDelaySeconds (%v) + the drain time (%v s), or in-flight requests are killed" .Values.terminationGracePeriodSeconds .Values.preStopDelaySeconds $drain) }}
{{- end }}
{{- end }}

{{/* The leader-election Lease: config.kubernetes.lease.name, else <fullname>-scaler (the
Role's get/update rule names it). */}}
{{- define "sluice.leaseName" -}}
{{- $kube := get .Values.config "kubernetes" | default dict }}
{{- $lease := get $kube "lease" | default dict }}
{{- get $lease "name" | default (printf "%s-scaler" (include "sluice.fullname" . | trunc 56 | trimSuffix "-")) }}
{{- end }}

{{/* The Secret holding the admin token: the user's, or the one the chart creates. */}}
{{- define "sluice.adminTokenSecret" -}}
{{- .Values.adminToken.existingSecret | default (printf "%s-admin-token" (include "sluice.fullname" . | trunc 50 | trimSuffix "-")) }}
{{- end }}
