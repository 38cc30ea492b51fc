"""What the k8sschema tests (pko.api.k8sschema, hack/import_k8s_openapi.py) share: the definition
names' prefixes and the pod template fields of recent releases the import must have."""

from __future__ import annotations

CORE = "io.k8s.api.core.v1."
META = "io.k8s.apimachinery.pkg.apis.meta.v1."
POD_TEMPLATE = CORE + "PodTemplateSpec"

# Pod template fields of recent releases (1.21 to 1.33): the import must be current.
RECENT_PATHS = (
    "spec.initContainers[].restartPolicy",  # native sidecars
    "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[].namespaceSelector",
    "spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[].podAffinityTerm.matchLabelKeys",
    "spec.containers[].resizePolicy[].resourceName",
    "spec.containers[].resources.claims[].name",
    "spec.containers[].securityContext.appArmorProfile.type",
    "spec.containers[].lifecycle.preStop.sleep.seconds",
    "spec.os.name",
    "spec.schedulingGates[].name",
    "spec.hostUsers",
    "spec.volumes[].image.reference",
    "spec.topologySpreadConstraints[].nodeAffinityPolicy",
)
