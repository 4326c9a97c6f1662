{{/* The release's base name: every object is named after it. */}}
{{- define "difftrain.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Names of the objects (the worker Job's name is also its pods' hostname prefix). */}}
{{- define "difftrain.controllerName" -}}{{ include "difftrain.fullname" . }}-controller{{- end -}}
{{- define "difftrain.workerName" -}}{{ include "difftrain.fullname" . }}-worker{{- end -}}
{{- define "difftrain.workersServiceName" -}}{{ include "difftrain.fullname" . }}-workers{{- end -}}
{{- define "difftrain.jobConfigMapName" -}}
{{- .Values.job.existingConfigMap | default (printf "%s-job" (include "difftrain.fullname" .)) -}}
{{- end -}}
{{- define "difftrain.keysSecretName" -}}
{{- .Values.keys.existingSecret | default (printf "%s-keys" (include "difftrain.fullname" .)) -}}
{{- end -}}
{{- define "difftrain.checkpointClaimName" -}}
{{- .Values.checkpoint.existingClaim | default (printf "%s-checkpoints" (include "difftrain.fullname" .)) -}}
{{- end -}}

{{- define "difftrain.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component (controller or worker): pass (list $ "worker"). */}}
{{- define "difftrain.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "difftrain.image" -}}
{{- printf "%s:%s" (required "image.repository is required" .Values.image.repository) (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Devices per node: GPUs, or CPU rank slots for a CPU job. */}}
{{- define "difftrain.devicesPerNode" -}}
{{- if gt (int .Values.gpusPerNode) 0 }}{{ int .Values.gpusPerNode }}{{ else }}{{ int .Values.cpuRanksPerNode }}{{ end -}}
{{- end -}}

{{/* The job spec as YAML text: specYaml verbatim, or spec with checkpoint.dir set to the
     checkpoint volume when the spec has none. */}}
{{- define "difftrain.jobSpecYaml" -}}
{{- if .Values.job.specYaml -}}
{{- .Values.job.specYaml -}}
{{- else -}}
{{- $spec := deepCopy (.Values.job.spec | default dict) -}}
{{- if .Values.checkpoint.enabled -}}
{{- $ckpt := get $spec "checkpoint" | default dict -}}
{{- $mount := trimSuffix "/" .Values.checkpoint.mountPath -}}
{{- $dir := toString (get $ckpt "dir" | default "") -}}
{{- if not $dir -}}
{{- $_ := set $ckpt "dir" (printf "%s/%s" $mount .Release.Name) -}}
{{- else if not (or (eq $dir $mount) (hasPrefix (printf "%s/" $mount) $dir)) -}}
{{- fail (printf "job.spec.checkpoint.dir %q is not on the checkpoint volume (checkpoint.mountPath %q): checkpoints there would be lost with the pod" $dir .Values.checkpoint.mountPath) -}}
{{- end -}}
{{- $_ := set $spec "checkpoint" $ckpt -}}
{{- end -}}
{{- toYaml $spec -}}
{{- end -}}
{{- end -}}

{{/* The run's checkpoint directory, for the samples Job: samples.checkpointDir, else the job
     spec's checkpoint.dir as difftrain.jobSpecYaml sets it (a job spec the chart does not
     build, specYaml or an existing ConfigMap, it cannot read). */}}
{{- define "difftrain.checkpointDir" -}}
{{- if .Values.samples.checkpointDir -}}
{{- .Values.samples.checkpointDir -}}
{{- else if or .Values.job.specYaml .Values.job.existingConfigMap -}}
{{- fail "samples.checkpointDir: required with job.specYaml or job.existingConfigMap (the checkpoint.dir the job spec sets), for the samples Job" -}}
{{- else -}}
{{- $ckpt := get (.Values.job.spec | default dict) "checkpoint" | default dict -}}
{{- get $ckpt "dir" | default (printf "%s/%s" (trimSuffix "/" .Values.checkpoint.mountPath) .Release.Name) -}}
{{- end -}}
{{- end -}}

{{/* The pod spec parts the Jobs share: scheduling, security, image pull secrets. */}}
{{- define "difftrain.podScheduling" -}}
restartPolicy: Never
terminationGracePeriodSeconds: {{ int .Values.terminationGracePeriodSeconds }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Restarts belong to the controller (docs/kubernetes.md, "Restarts"): Kubernetes
     replaces a pod only when it was disrupted or checkpointed on request (exit 75), and
     never counts those; a daemon that exits 1 (job failed) or 2 (bad input) fails the
     Job at once; any other failure counts against backoffLimit. The exit-code rules carry
     an empty onPodConditions: Kubernetes 1.26's API (the oldest the chart supports) requires
     the field in every rule; later versions accept it. */}}
{{- define "difftrain.podFailurePolicy" -}}
podFailurePolicy:
  rules:
    - action: Ignore
      onPodConditions:
        - type: DisruptionTarget
          status: "True"
    - action: Ignore
      onExitCodes:
        containerName: difftrain
        operator: In
        values: [75]
      onPodConditions: []
    - action: FailJob
      onExitCodes:
        containerName: difftrain
        operator: In
        values: [1, 2]
      onPodConditions: []
{{- end -}}

{{/* Environment of every difftrain container. */}}
{{- define "difftrain.env" -}}
{{- range $name, $value := .Values.nccl.env }}
- name: {{ $name }}
  value: {{ toString $value | quote }}
{{- end }}
{{- if and .Values.rdma.enabled .Values.rdma.hca }}
- name: NCCL_IB_HCA
  value: {{ .Values.rdma.hca | quote }}
{{- end }}
{{- range $name, $value := .Values.env }}
- name: {{ $name }}
  value: {{ toString $value | quote }}
{{- end }}
{{- end -}}

{{- define "difftrain.metricsAnnotations" -}}
{{- if .Values.metrics.scrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metrics.port | quote }}
prometheus.io/path: {{ .Values.metrics.path | quote }}
{{- end }}
{{- end -}}

{{/* The job's keys: difftrain refuses key files that anyone but their owner can read,
     and a Secret volume's files are root's, or group-readable under fsGroup. So an init
     container copies them, mode 0600 and owned by the pod's user, into a memory-backed
     emptyDir at keys.mountPath, where the daemons read them. */}}
{{- define "difftrain.keysInitContainer" -}}
- name: keys
  image: {{ include "difftrain.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - install
    - --mode=0600
    - --target-directory={{ .Values.keys.mountPath }}
    - /etc/difftrain/keys-secret/controller.key
    - /etc/difftrain/keys-secret/client.key
  resources:
    requests: {cpu: 10m, memory: 16Mi}
    limits: {memory: 16Mi}
  volumeMounts:
    - name: keys-secret
      mountPath: /etc/difftrain/keys-secret
      readOnly: true
    - name: keys
      mountPath: {{ .Values.keys.mountPath }}
{{- end -}}

{{- define "difftrain.keysVolumes" -}}
- name: keys-secret
  secret:
    secretName: {{ include "difftrain.keysSecretName" . }}
    defaultMode: 0400
- name: keys
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end -}}
