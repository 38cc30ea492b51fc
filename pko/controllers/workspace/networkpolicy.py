"""One NetworkPolicy per Workspace: only the operator's pods reach its agent's gRPC port (issue 46).

The agent already refuses callers that fail its TokenReview and SubjectAccessReview; this is the
layer below it, so that nothing else in the cluster can even open a connection to the port. The
policy, named as the Workspace's StatefulSet and Service, selects the Workspace's pod by the labels
its StatefulSet gives it (:func:`~pko.controllers.workspace.workloads.workspace_labels`, which a pod
template cannot rename) and allows ingress to TCP :data:`WORKSPACE_PORT` only from pods labelled
:data:`OPERATOR_POD_LABELS` in the operator's namespace (its ``kubernetes.io/metadata.name`` label,
which Kubernetes sets on every namespace). A pod selected by a policy with ``Ingress`` admits
nothing else, so a port a user adds to the pod needs a policy of the user's too; traffic from the
pod's own node (the kubelet's probes) is always allowed by the NetworkPolicy API. Egress is left
alone: what a program reaches (its cloud, its registry, the git server, the backend) is the user's
to restrict (docs/security.md). The agent's metrics port (:data:`METRICS_PORT`, unless
``--workspace-metrics=off``) is open to every source: wherever the cluster's Prometheus runs, a
scraper still needs a token that may get ``/metrics`` (over HTTPS unless ``--workspace-metrics=http``).

Controlled by the Workspace, so it goes with it. A separate small controller rather than a step of
the Workspace reconciler: it is optional (``--workspace-network-policy``; the operator run outside
the cluster network, whose calls come from no pod, turns it off) and depends on nothing the
Workspace reconciler decides. It is woken by a Workspace's creation (on start, each cached one) and
by any change to a policy it made, which it puts back; a settled policy costs no write (its applied
digest is compared in the cache). Enforcement is the CNI plugin's: one that implements no
NetworkPolicy (the bridge plugin, for one) stores the object and lets every connection through.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pko.controllers.options import ControllerOptions
from pko.controllers.resources import FIELD_MANAGER, WORKSPACE_SELECTOR, WORKSPACES
from pko.controllers.workspace.podspec import METRICS_PORT, WORKSPACE_PORT
from pko.controllers.workspace.workloads import statefulset_name, workspace_labels
from pko.machinery.controller import Result
from pko.machinery.manager import Manager
from pko.machinery.objects import set_controller_reference
from pko.machinery.resource import Obj, Resource
from pko.machinery.store import object_key, split_key
from pko.machinery.writes import DigestApplier, stamp

__all__ = [
    "CONTROLLER_NAME",
    "NAMESPACE_NAME_LABEL",
    "NETWORK_POLICIES",
    "OPERATOR_POD_LABELS",
    "NetworkPolicyReconciler",
    "desired_network_policy",
    "setup",
]

NETWORK_POLICIES: Final = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
CONTROLLER_NAME: Final = "workspace-networkpolicy-controller"
# The operator's pods carry this label in every install (config/manager, the chart; the tests
# check both), and so do the Go operator's (v2.9.0's pod template has no other), so a cluster
# switched back to it keeps its agents reachable: with the operator's namespace it names the only
# callers admitted.
OPERATOR_POD_LABELS: Final[Mapping[str, str]] = {"control-plane": "controller-manager"}
# Set by Kubernetes (1.21 and later) on every namespace to its own name.
NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"
# A settled policy is a cache read: two workers keep up with a whole fleet at start.
WORKERS: Final = 2


def desired_network_policy(
    workspace: Mapping[str, Any], operator_namespace: str, *, metrics: bool = False
) -> Obj:
    """The NetworkPolicy of ``workspace`` (read from the API: the owner reference needs its uid),
    stamped with its digest; with ``metrics``, its agent's metrics port open to any scraper."""
    meta = workspace.get("metadata") or {}
    name, namespace = str(meta["name"]), str(meta.get("namespace") or "")
    labels = workspace_labels(name)
    scrapes = [{"ports": [{"protocol": "TCP", "port": METRICS_PORT}]}] if metrics else []
    body: Obj = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": statefulset_name(name), "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "podSelector": {"matchLabels": dict(labels)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: operator_namespace}},
                            "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)},
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": WORKSPACE_PORT}],
                },
                *scrapes,
            ],
        },
    }
    set_controller_reference(dict(workspace), body)
    return stamp(body)


def _created_or_deleted(old: Obj | None, new: Obj | None) -> bool:
    """A Workspace's policy depends on its name and uid only: no update of it changes the policy."""
    return old is None or new is None


class NetworkPolicyReconciler:
    """Keeps each Workspace's NetworkPolicy as :func:`desired_network_policy` builds it."""

    def __init__(self, manager: Manager, options: ControllerOptions | None = None) -> None:
        self.options = options or ControllerOptions()
        self.workspaces = manager.informer(WORKSPACES)
        policies = manager.informer(NETWORK_POLICIES, label_selector=WORKSPACE_SELECTOR)
        self.applier = DigestApplier(
            policies, FIELD_MANAGER, client=manager.client(NETWORK_POLICIES), force=True
        )

    async def reconcile(self, key: str) -> Result:
        workspace = self.workspaces.latest(key)
        if workspace is None or (workspace.get("metadata") or {}).get("deletionTimestamp"):
            namespace, name = split_key(key)
            self.applier.forget(object_key(namespace, statefulset_name(name)))
            return Result.done()  # its policy goes with it (garbage collection)
        body = desired_network_policy(
            workspace, self.options.operator_namespace, metrics=self.options.workspace_metrics != "off"
        )
        await self.applier.ensure(body)
        return Result.done()


def setup(manager: Manager, options: ControllerOptions | None = None) -> NetworkPolicyReconciler:
    reconciler = NetworkPolicyReconciler(manager, options)
    (
        manager.controller(CONTROLLER_NAME, reconciler, workers=WORKERS)
        .for_(WORKSPACES, predicate=_created_or_deleted)
        .owns(NETWORK_POLICIES, label_selector=WORKSPACE_SELECTOR)
    )
    return reconciler
