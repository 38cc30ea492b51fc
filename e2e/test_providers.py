"""The providers built from pinned source (hack/build-sources.sh) at work in real workspace pods: the
workspace image carries pulumi-random and pulumi-command at their pinned versions, and the engine never
downloads a plugin (PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION), so a Stack Ready here ran the ones we
built. Each stack keeps its state on a PersistentVolumeClaim of its own, as in test_walkthrough."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import pytest

from pko.devtools.examples import local_example
from pko.devtools.versions import versions

from .conftest import Kube
from .stacks import gone, ready, stack

pytestmark = pytest.mark.timeout(1800)

# A local command with a create and a delete script. The create takes two seconds and leaves a line on
# the state claim; the delete appends the create's stdout (PULUMI_COMMAND_STDOUT, which the provider
# hands it) there, so what ran is readable after the workspace pod is gone.
COMMAND_PROGRAM = """\
apiVersion: pulumi.com/v1
kind: Program
metadata:
  name: {name}
program:
  resources:
    cmd:
      type: command:local:Command
      properties:
        create: "sleep 2; echo create >> /state/{name}.log; echo hello from command"
        delete: "{{ printf 'delete: '; printenv PULUMI_COMMAND_STDOUT; }} >> /state/{name}.log"
  outputs:
    stdout: ${{cmd.stdout}}
"""

# A pod that prints the command's log from the claim (the restricted profile's settings, as HANG's pod).
READER = """\
apiVersion: v1
kind: Pod
metadata:
  name: {name}-reader
spec:
  restartPolicy: Never
  securityContext:
    runAsNonRoot: true
    runAsUser: 1000
    seccompProfile: {{type: RuntimeDefault}}
  containers:
    - name: cat
      image: localhost/pko-base-python:bookworm
      imagePullPolicy: Never
      command: [cat, /state/{name}.log]
      securityContext:
        allowPrivilegeEscalation: false
        capabilities: {{drop: [ALL]}}
      volumeMounts:
        - name: state
          mountPath: /state
  volumes:
    - name: state
      persistentVolumeClaim:
        claimName: {name}-state
"""


def _plugins(k: Kube, name: str) -> set[tuple[str, str, str]]:
    """(name, kind, version) of every plugin `pulumi plugin ls` lists in the stack's workspace pod."""
    out = k.run("exec", f"{name}-workspace-0", "-c", "pulumi", "--", "pulumi", "plugin", "ls")
    rows = (line.split() for line in out.splitlines()[1:])
    return {(r[0], r[1], r[2]) for r in rows if len(r) >= 3 and r[1] == "resource"}


def _seconds(update: dict[str, object]) -> float:
    status = update.get("status") or {}
    assert isinstance(status, dict)
    start, end = (
        datetime.fromisoformat(str(status[t]).replace("Z", "+00:00")) for t in ("startTime", "endTime")
    )
    return (end - start).total_seconds()


def test_random_pet_and_password_with_a_secret_output(kube: Kube, tmp_path: Path) -> None:
    """examples/random-yaml (upstream's random-yaml as a Program) as users apply it: the password's
    ``result`` is secret by the provider's schema, so the output is secret with no fn::secret."""
    k, name = kube, "random-yaml"
    k.apply(k.run("kustomize", str(local_example(name, tmp_path / name))))
    s = ready(k, name)

    outputs = s["status"]["outputs"]
    assert set(outputs) == {"petName", "password"}, outputs
    assert re.fullmatch(r"[a-z]+-[a-z]+", outputs["petName"]), outputs
    assert outputs["password"] == "[secret]", outputs
    last = s["status"]["lastUpdate"]
    assert (last["state"], last["type"]) == ("succeeded", "up"), last

    # The image's providers, at the pinned versions (no other random could have been downloaded).
    v = versions()
    plugins = _plugins(k, name)
    assert ("random", "resource", v["PULUMI_RANDOM_VERSION"]) in plugins, plugins
    assert ("command", "resource", v["PULUMI_COMMAND_VERSION"]) in plugins, plugins
    assert ("kubernetes", "resource", v["PULUMI_KUBERNETES_VERSION"]) in plugins, plugins

    k.run("delete", "stack", name, "--wait=false")
    gone(k, "stack", name)
    gone(k, "workspace", name)
    k.run("delete", "program", name)
    k.run("delete", "pvc", f"{name}-state", "--wait=false")


def test_a_local_command_runs_its_create_and_on_stack_deletion_its_delete(kube: Kube) -> None:
    k, name = kube, "command"
    k.apply(COMMAND_PROGRAM.format(name=name))
    k.apply(stack(name, f"programRef:\n    name: {name}"))
    s = ready(k, name)

    assert s["status"]["outputs"] == {"stdout": "hello from command"}, s["status"]
    last = s["status"]["lastUpdate"]
    assert (last["state"], last["type"]) == ("succeeded", "up"), last
    # The update waited for the create script (its `sleep 2`).
    updates = k.json("get", "update", "-l", f"pulumi.com/stack-name={name}")["items"]
    ups = [u for u in updates if (u.get("spec") or {}).get("type") == "up"]
    assert ups and max(_seconds(u) for u in ups) >= 2, updates

    # kubectl delete stack: destroyOnFinalize destroys, which runs the delete script, then the Stack goes.
    k.run("delete", "stack", name, "--wait=false")
    gone(k, "stack", name, within=600)
    gone(k, "workspace", name)
    gone(k, "pod", f"{name}-workspace-0")

    k.apply(READER.format(name=name))
    k.until(
        f"pod {name}-reader finished",
        lambda: (
            ((k.get("pod", f"{name}-reader") or {}).get("status") or {}).get("phase")
            in ("Succeeded", "Failed")
        ),
        120,
    )
    log = k.run("logs", f"{name}-reader")
    assert log.splitlines() == ["create", "delete: hello from command"], log

    k.run("delete", "pod", f"{name}-reader", "--wait=false")
    k.run("delete", "program", name)
    k.run("delete", "pvc", f"{name}-state", "--wait=false")
