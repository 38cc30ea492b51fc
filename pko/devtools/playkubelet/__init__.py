"""A play-kubelet: runs workspace pods as local processes and reports them as a kubelet would.

There is no kubelet (nor container runtime) in the test control plane, so this plays one, the way
upstream's envtest suite writes pod status by hand, but with the real programs running. Everything
upstream of the pod is the product's own code path: the operator applies a StatefulSet, the real
kube-controller-manager's StatefulSet controller creates the pod, and only then does this harness
act, on pods labelled ``auto.pulumi.com/component=workspace`` in the namespaces it is given:

* **Scheduling.** It binds the pod to its Node (``play-kubelet``, created if missing) through the
  ``pods/binding`` subresource, as the scheduler does; a bound pod is deleted gracefully by the
  apiserver, and the Node's existence keeps the pod GC from removing it. ``unschedulable(key)``
  instead writes ``PodScheduled=False`` (reason ``Unschedulable``) and leaves the pod pending.
* **Sandbox.** Each pod gets a loopback IP of its own (``127.a.b.c``, never reused in a process;
  the whole 127/8 is routed to ``lo`` on Linux) as ``status.podIP``; ``hostIP`` is 127.0.0.1.
  Every volume is a directory under the pod's directory (emptyDir; secret, configMap, projected and
  downwardAPI volumes are written from the API; a PVC is a directory per claim that outlives pods),
  and each container's mount paths are rewritten in its command, args, env and workingDir
  (``/share`` -> ``<pod dir>/volumes/share``).
* **Containers.** Init containers run in order, then the main containers, each as a process
  group; restartPolicy Always restarts exited containers after a (short) doubling back-off with
  ``CrashLoopBackOff`` and a growing ``restartCount``. A failed init container is restarted the same
  way and keeps ``Initialized=False``; with ``terminationMessagePolicy: FallbackToLogsOnError`` its
  ``message`` is the tail of its output (the kubelet's 80 lines / 2 KiB). An image the harness does
  not know is never run: ``ErrImagePull`` then ``ImagePullBackOff``, retried as a kubelet retries.
* **Programs.** An image has no filesystem here, so the agent image's programs are mapped: a
  command naming ``agent`` (``/share/agent ...``, ``/share/tini /share/agent -- ...``, ``/agent``)
  runs ``python -m pko.agent ...`` (``serve`` gets ``--host <podIP>``, and its
  ``--metrics-bind-address :PORT`` becomes ``<podIP>:PORT``), the bootstrap copy
  ``cp -r /agent /agent-lib /tini /share/`` writes small shims instead and succeeds, ``tini`` is
  dropped; any other command runs as it is (``sh -c 'echo hi > /share/x'``). Every container gets
  the Pulumi engine first on PATH and its PULUMI_* variables as the image's environment (the
  container's own env wins); the file backend is shared by all pods of one harness, like a real
  backend. The engine is the stand-in CLI unless ``engine=make_real_pulumi`` (pko.devtools.realpulumi)
  brings the real one.
* **Identity.** A container that mounts the service-account token path gets ``KUBECONFIG`` pointing
  at the test apiserver with a TokenRequest token bound to the pod, minted for the pod's
  ``serviceAccountName`` (what in-cluster config gives a real pod), so the agent's
  ``--auth-mode kube`` does real TokenReviews and SubjectAccessReviews.
* **Deletion.** A pod with a ``deletionTimestamp`` gets SIGTERM, then SIGKILL after its grace period
  (optionally capped by ``max_grace``), then is deleted with ``gracePeriodSeconds=0``, as a kubelet
  finishes a deletion, so the StatefulSet controller creates the replacement.

Not played: liveness and startup probes, lifecycle hooks, resource limits, service links, image pull
policy, pod-level securityContext. Readiness probes are (tcpSocket, grpc, httpGet, exec).

Used by the reconciler tests (test/controllers/conftest.py's ``kubelet`` fixture) and by
hack/bench/deploy.py.
"""

from .harness import NODE_NAME, WORKSPACE_SELECTOR, PlayKubelet
from .identities import create_service_account, grant_auth_delegator, grant_workspace_rpc, mint_token
from .programs import AGENT_IMAGE, IMAGE_CONFIG, KNOWN_IMAGES, normalize_image, rewrite_paths
from .runtime import AGENT_PORT

__all__ = [
    "AGENT_IMAGE",
    "AGENT_PORT",
    "IMAGE_CONFIG",
    "KNOWN_IMAGES",
    "NODE_NAME",
    "WORKSPACE_SELECTOR",
    "PlayKubelet",
    "create_service_account",
    "grant_auth_delegator",
    "grant_workspace_rpc",
    "mint_token",
    "normalize_image",
    "rewrite_paths",
]
