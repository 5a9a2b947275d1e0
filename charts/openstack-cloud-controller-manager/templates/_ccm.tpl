{{- /*
The objects of every cloud-controller-manager chart of this repository. Source:
charts/common/_ccm.tpl, copied into each chart's templates/ by hack/render-charts.sh (a test
fails when a copy differs). The objects themselves are the provider's kustomize base
(deploy/<provider>/base, rendered into files/base.yaml by the same script): the chart applies
this release's values to them, so the chart and the kustomize bases cannot drift apart.

A chart provides, in its own templates/_provider.tpl:
  ccm.providerArgs          a YAML list of flags added for the values (e.g. --cloud-config)
  ccm.providerVolumes       a YAML list of volumes added for the values
  ccm.providerVolumeMounts  a YAML list of volume mounts added for the values
  ccm.cloudConfigChecksum   what the Pods restart on when it changes (the cloud config)
*/ -}}

{{- define "ccm.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "ccm.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{- /* Applies the values to the base's DaemonSet (a map, changed in place). */ -}}
{{- define "ccm.daemonset" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $pod := .ds.spec.template.spec -}}
{{- $c := index $pod.containers 0 -}}
{{- $_ := set $c "image" (include "ccm.image" $root) -}}
{{- $_ := set $c "imagePullPolicy" $v.image.pullPolicy -}}
{{- $args := $c.args -}}
{{- $args = concat $args (include "ccm.providerArgs" $root | fromYamlArray) -}}
{{- if $v.useServiceAccountCredentials -}}
{{- $args = append $args "--use-service-account-credentials=true" -}}
{{- end -}}
{{- $args = concat $args $v.args -}}
{{- $_ := set $c "args" $args -}}
{{- with $v.env }}{{ $_ := set $c "env" . }}{{ end -}}
{{- with $v.envFrom }}{{ $_ := set $c "envFrom" . }}{{ end -}}
{{- with $v.resources }}{{ $_ := set $c "resources" . }}{{ end -}}
{{- $mounts := concat ($c.volumeMounts | default list) (include "ccm.providerVolumeMounts" $root | fromYamlArray) $v.extraVolumeMounts -}}
{{- if $mounts }}{{ $_ := set $c "volumeMounts" $mounts }}{{ end -}}
{{- $volumes := concat ($pod.volumes | default list) (include "ccm.providerVolumes" $root | fromYamlArray) $v.extraVolumes -}}
{{- if $volumes }}{{ $_ := set $pod "volumes" $volumes }}{{ end -}}
{{- $_ := set $pod "tolerations" (concat $pod.tolerations $v.tolerations) -}}
{{- with $v.affinity }}{{ $_ := set $pod "affinity" . }}{{ end -}}
{{- with $v.nodeSelector }}{{ $_ := set $pod "nodeSelector" . }}{{ end -}}
{{- $_ := set $pod "priorityClassName" $v.priorityClassName -}}
{{- $_ := set $pod "hostNetwork" $v.hostNetwork -}}
{{- with $v.imagePullSecrets }}{{ $_ := set $pod "imagePullSecrets" . }}{{ end -}}
{{- $meta := .ds.spec.template.metadata -}}
{{- $annotations := merge (dict "checksum/cloud-config" (include "ccm.cloudConfigChecksum" $root | sha256sum)) $v.podAnnotations -}}
{{- $_ := set $meta "annotations" $annotations -}}
{{- $_ := set $meta "labels" (merge $meta.labels (dict "app.kubernetes.io/instance" $root.Release.Name)) -}}
{{- end -}}

{{- /* Every object of the release. */ -}}
{{- define "ccm.objects" -}}
{{- $root := . -}}
{{- $files := list "files/base.yaml" -}}
{{- if .Values.useServiceAccountCredentials }}{{ $files = append $files "files/service-account-credentials.yaml" }}{{ end -}}
{{- range $file := $files }}
{{- range $doc := regexSplit "(?m)^---[ \t]*$" ($root.Files.Get $file) -1 }}
{{- $obj := fromYaml $doc }}
{{- if $obj }}
{{- if eq $obj.kind "DaemonSet" }}{{ include "ccm.daemonset" (dict "ds" $obj "root" $root) }}{{ end }}
{{- if and (eq $obj.kind "ServiceAccount") $root.Values.serviceAccount.annotations }}
{{- $_ := set $obj.metadata "annotations" $root.Values.serviceAccount.annotations }}
{{- end }}
{{- $_ := set $obj.metadata "labels" (merge ($obj.metadata.labels | default dict) (include "ccm.labels" $root | fromYaml)) }}
---
{{ toYaml $obj }}
{{- end }}
{{- end }}
{{- end }}
{{- if or .Values.serviceMonitor.enabled .Values.podMonitor.enabled }}
{{- include "ccm.monitors" . }}
{{- end }}
{{- end -}}

{{- /*
Prometheus Operator objects (the CRDs must be installed): /metrics over HTTPS with the
Prometheus ServiceAccount's token, which the CCM checks with a SubjectAccessReview (grant it
`get` on the non-resource URL /metrics; deploy/README.md "Reading /metrics"). The CCM's
certificate is self-signed unless --tls-cert-file is given: insecureSkipVerify by default.
*/ -}}
{{- define "ccm.monitors" -}}
{{- $endpoint := dict "port" "https" "scheme" "https" "path" "/metrics" "interval" .Values.serviceMonitor.interval "bearerTokenFile" "/var/run/secrets/kubernetes.io/serviceaccount/token" "tlsConfig" (dict "insecureSkipVerify" true) -}}
{{- if .Values.serviceMonitor.enabled }}
---
apiVersion: v1
kind: Service
metadata:
  name: cloud-controller-manager-metrics
  namespace: kube-system
  labels:
    k8s-app: cloud-controller-manager
    {{- include "ccm.labels" . | nindent 4 }}
spec:
  clusterIP: None
  selector:
    k8s-app: cloud-controller-manager
  ports:
  - name: https
    port: 10258
    targetPort: https
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: cloud-controller-manager
  namespace: kube-system
  labels:
    {{- include "ccm.labels" . | nindent 4 }}
    {{- with .Values.serviceMonitor.labels }}{{ toYaml . | nindent 4 }}{{ end }}
spec:
  selector:
    matchLabels:
      k8s-app: cloud-controller-manager
      app.kubernetes.io/instance: {{ .Release.Name }}
  endpoints:
  - {{- toYaml $endpoint | nindent 4 }}
{{- end }}
{{- if .Values.podMonitor.enabled }}
---
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata:
  name: cloud-controller-manager
  namespace: kube-system
  labels:
    {{- include "ccm.labels" . | nindent 4 }}
    {{- with .Values.podMonitor.labels }}{{ toYaml . | nindent 4 }}{{ end }}
spec:
  selector:
    matchLabels:
      k8s-app: cloud-controller-manager
      app.kubernetes.io/instance: {{ .Release.Name }}
  podMetricsEndpoints:
  - {{- toYaml (omit $endpoint "bearerTokenFile") | nindent 4 }}
    authorization:
      credentials:
        name: {{ required "podMonitor.tokenSecret.name: the Secret with a token allowed to read /metrics" .Values.podMonitor.tokenSecret.name | quote }}
        key: {{ .Values.podMonitor.tokenSecret.key | quote }}
{{- end }}
{{- end -}}
