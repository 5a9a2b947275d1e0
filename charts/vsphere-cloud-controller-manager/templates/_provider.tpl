{{- /* The base mounts the cloud config and passes --cloud-config already. */ -}}
{{- define "ccm.providerArgs" -}}
[]
{{- end -}}
{{- define "ccm.providerVolumeMounts" -}}
[]
{{- end -}}
{{- define "ccm.providerVolumes" -}}
[]
{{- end -}}
{{- define "ccm.cloudConfigChecksum" -}}
{{ .Values.cloudConfig.contents }}
{{- end -}}
