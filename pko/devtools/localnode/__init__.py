"""A whole single-node Kubernetes on this machine: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kubelet, containerd + runc, a CNI bridge, kube-proxy and cluster DNS.

    python3 hack/localnode.py up [--import FILE.oci.tar ...]   # prints the kubeconfig path
    python3 hack/localnode.py down                             # everything goes, nothing is left
    python3 hack/localnode.py status
    python3 hack/localnode.py restart kubelet [--signal KILL] [--down-for S]   # one component
    python3 hack/localnode.py node-add [--import FILE.oci.tar ...]   # a second node, pko-node2
    python3 hack/localnode.py node-lose     # pko-node2's machine dies (SIGKILL, no cleanup)
    python3 hack/localnode.py node-remove   # pko-node2 goes, and all it made (`down` does it too)
    python3 hack/localnode.py trust-registry HOST:PORT CA_FILE   # containerd trusts a registry's CA
    python3 hack/localnode.py untrust-registry HOST:PORT
    python3 hack/localnode.py remove-images PATTERN...           # e.g. 'docker.io/library/pko*:dev'
    python3 hack/localnode.py import-images [--import FILE.oci.tar ...]   # back in (default: all of up's)

Standard library only (it runs before the project's virtualenv exists). Needs root, cgroups and
the Kubernetes and etcd binaries `hack/build-kubernetes.sh` builds from the Go module proxy (the
versions in `hack/versions.env`, cached in ~/.cache/pko); kubectl is the one built with them. Every
trap of these machines is handled here: Debian's containerd 1.6 with ``restrict_oom_score_adj`` and the
``overlayfs`` snapshotter where an overlay mount works (else ``native``, a whole copy of the image for
each container); runc on cgroup v1 with the ``cgroupfs`` driver (containerd 1.6 lacks the CRI
RuntimeConfig call, so the kubelet uses its configured ``cgroupDriver``, and on cgroup v1 it needs
``failCgroupV1: false``); a pause image compiled from ``build/pause/linux/pause.c`` of the
k8s.io/kubernetes module of the same release; a node IP on a veth pair of our own (no ``dummy``
module); ``--kubelet-preferred-address-types`` so the apiserver never resolves the node name through
an outside DNS server.

Pod Security: the PodSecurity admission (built in since 1.25) enforces the level a namespace's
``pod-security.kubernetes.io/enforce`` label names; the node sets no cluster-wide default, so the
namespaces where workspaces run are labelled ``restricted`` by what creates them (config/manager,
config/samples, e2e/).

Network: the node IP ``10.87.0.1`` (veth ``pkonode0``), pods on the bridge ``pkobr0``
(``10.88.0.0/24``), Services in ``10.0.0.0/24``. Nothing is masqueraded and DNS never forwards:
traffic stays on loopback and on the devices created here. Cluster DNS is dnsmasq (Debian) fed by
``hack/clusterdns.py`` from the API's Services and Endpoints, so ``<svc>.<ns>.svc.cluster.local``
resolves in pods as in a real cluster.

A second node (``node-add``, issue 28): ``pko-node2`` at ``10.87.0.2`` in a network namespace of its
own, pods in ``10.88.1.0/24`` on its bridge ``pkobr1``, its own containerd, kubelet and kube-proxy
(``containerd-2``, ``kubelet-2``, ``kube-proxy-2``, which ``restart`` knows too) joined to the same
control plane, and the taint ``pko.dev/spare-node=true:NoSchedule``, so that only pods that tolerate it
(the fault matrix's) land there; see :data:`NODE2` for how the two kubelets share one machine.

State lives in ``.node/`` (gitignored; node 2's in ``.node/node2``); images are imported from
``~/.cache/pko/images/*.oci.tar`` (``hack/build-images.sh``; the cache is ``$PKO_CACHE_DIR`` when set,
as for the builds) on every ``up`` and ``node-add``: all of them, or the ``--import`` ones (hack/up.sh
names the archives ``hack/build-images.sh sample`` printed, so a SeaweedFS left in the cache stays out),
and by ``import-images`` into the running node at any time (containerd's ``k8s.io`` namespace, as at
boot: hack/test.sh boots with the sample set and imports SeaweedFS once it is built).
"""
