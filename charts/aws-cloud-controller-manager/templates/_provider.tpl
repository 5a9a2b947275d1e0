{{- /* AWS: the cloud config is optional (IMDS gives the region and instance). */ -}}
{{- define "ccm.providerArgs" -}}
{{- if .Values.cloudConfig.contents }}
- --cloud-config=/etc/kubernetes/cloud-config/cloud.conf
{{- else }}
[]
{{- end }}
{{- end -}}
{{- define "ccm.providerVolumeMounts" -}}
{{- if .Values.cloudConfig.contents }}
- name: cloud-config
  mountPath: /etc/kubernetes/cloud-config
  readOnly: true
{{- else }}
[]
{{- end }}
{{- end -}}
{{- define "ccm.providerVolumes" -}}
{{- if .Values.cloudConfig.contents }}
- name: cloud-config
  configMap:
    name: aws-cloud-config
{{- else }}
[]
{{- end }}
{{- end -}}
{{- define "ccm.cloudConfigChecksum" -}}
{{ .Values.cloudConfig.contents }}
{{- end -}}
