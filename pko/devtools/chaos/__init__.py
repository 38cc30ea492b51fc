"""The fault matrix: every fault we can cause on the local node, during every Stack operation, on both
state backends, each cell judged from outside (kubectl, the state backend's own files, and a witness
log the program's commands write).

    python3 hack/chaos.py                       # the full matrix (a node with pko: hack/up.sh first)
    python3 hack/chaos.py --reduced             # the cells .ci/run runs (through e2e/test_chaos.py)
    python3 hack/chaos.py --faults workspace-kill9,etcd-restart --operations up --backends s3

Each cell starts from a clean Stack (names of its own, in namespace ``chaos``) whose program is three
``command:local:Command`` resources in a chain, each sleeping ``--step-seconds`` before it appends a
line to ``/witness/log`` (a volume of its own, on the node's disk): so the fault lands mid-operation,
and what the engine really ran is counted after the fact, whatever the pods and the state say.

The cells of one fault run as a round, at once (``--serial``: one at a time): every operation on both
backends is brought in flight, each on its own Stack, then the fault lands once (the operator, the
node's components) or on every cell's workspace at the same moment (a kill, an eviction, a cut). A
cell whose operation was not in flight when the fault came fails: the fault must land mid-operation.

A cell passes when, within ``--bound`` seconds of the fault:
* the Stack is Ready for the intended change (or, for ``destroy``, gone);
* exactly one successful Update of the intended type ran for the change (a failed attempt followed by
  a retry is fine; two successes are not);
* every command of the change ran once (the witness log), or, where the engine cannot know whether a
  command it started finished (a pending operation), pko reported it on the Stack;
* the state holds no pending operation and no lock, and its resources are the program's (none after
  ``destroy``).

``node-lost`` runs on a second node (``localnode.py node-add``, removed after the round) that the
cells' workspace pods prefer and tolerate; the node's machine then dies for good. Kubernetes never
replaces a StatefulSet pod its node may still run, so the Stack must first be Stalled naming the node;
with S3 the harness then puts the out-of-service taint on it, as the message says and a person would,
and the cell is judged as above; a file state on the lost node's volume cannot come back, so there the
Stack must say so and no command may have run twice.

One more cell proves the retry settings (``spec.retryPolicy``, issue 28): ``cause-fixed`` makes the
first up fail (a program error on a missing file) until the Stack has backed off to its 30 s cap, then
fixes the cause outside the Stack; the fix must be picked up within the cap plus the up itself.

``--load N`` runs the load cell instead: N Stacks updating at once, a probe Stack changed meanwhile (its
Update must start within seconds: no worker is held by a running update), the operator killed -9 in
the middle, and every one of the N + 1 judged as a cell.

Output: a table fault x operation x backend (outcome, seconds from the fault to recovery), also written
as JSON (``--json``, default ``.bench-logs/chaos.json``). Standard library only, with the node's kubectl;
needs root (it signals the node's processes and writes iptables rules, as ``localnode.py`` does).
"""
