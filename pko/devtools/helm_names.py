"""config/default's object names in the chart: each becomes ``pko.objname`` of config's name, and every
reference to it follows (hack/gen_helm.py; the helpers are in helm_templates.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pko.devtools import helm_templates
from pko.devtools.helm_markers import MARK, NS_MARK, Markers, Obj, one

SA_MARK = MARK + "SERVICE_ACCOUNT"
BINDINGS = ("RoleBinding", "ClusterRoleBinding")


@dataclass
class Names:
    """config/'s object names, each the marker of its ``pko.objname`` expression, and the manager's
    ServiceAccount, whose name is ``pko.serviceAccountName`` wherever config/ refers to it."""

    namespace: str
    service_account: str
    markers: dict[str, str] = field(default_factory=dict)
    kinds: set[tuple[str, str]] = field(default_factory=set)

    @classmethod
    def of(cls, objs: list[Obj], namespace: str, service_account: str) -> Names:
        names = cls(namespace, service_account)
        named = [o for o in objs if o["kind"] not in ("CustomResourceDefinition", "Namespace")]
        names.kinds = {(o["kind"], o["metadata"]["name"]) for o in named}
        # Fixed-width numbers: no marker is a prefix of another.
        for i, name in enumerate(sorted({n for _, n in names.kinds})):
            names.markers[name] = MARK + f"NAME_{i:03d}"
        return names

    def add_to(self, markers: Markers) -> None:
        for name, marker in self.markers.items():
            markers.inline[marker] = helm_templates.name_expr(name)
        markers.inline[SA_MARK] = '{{ include "pko.serviceAccountName" $ }}'

    def binds_operator(self, obj: Obj) -> bool:
        """A binding whose subjects include the manager's ServiceAccount (after mark_namespace)."""
        return obj["kind"] in BINDINGS and any(
            s.get("kind") == "ServiceAccount" and s.get("name") in (self.service_account, SA_MARK)
            and s.get("namespace") == NS_MARK
            for s in obj.get("subjects", [])
        )  # fmt: skip

    def mark(self, obj: Obj) -> None:
        """Replace config/'s names, and the references to them, by their markers."""
        kind, meta = obj["kind"], obj["metadata"]
        is_sa = kind == "ServiceAccount" and meta["name"] == self.service_account
        meta["name"] = SA_MARK if is_sa else self.markers[meta["name"]]
        ref = obj.get("roleRef")
        if ref and (ref["kind"], ref["name"]) in self.kinds:
            ref["name"] = self.markers[ref["name"]]
        for subject in obj.get("subjects", []):
            if subject.get("kind") == "ServiceAccount" and subject.get("name") == self.service_account:
                if subject.get("namespace") == NS_MARK:
                    subject["name"] = SA_MARK
        if kind == "ValidatingAdmissionPolicyBinding":
            policy = obj["spec"]["policyName"]
            if ("ValidatingAdmissionPolicy", policy) not in self.kinds:
                raise SystemExit(
                    f"gen_helm: the admission policy binding names no policy of config/: {policy}"
                )
            obj["spec"]["policyName"] = self.markers[policy]
        for rule in obj.get("rules", []) if kind in ("Role", "ClusterRole") else []:
            if any(r.startswith("serviceaccounts") for r in rule.get("resources", [])):
                rule["resourceNames"] = [
                    SA_MARK if n == self.service_account else n for n in rule.get("resourceNames", [])
                ]
        user = re.compile(rf"(system:serviceaccount:{NS_MARK}:){re.escape(self.service_account)}(?![\w-])")
        replace_strings(obj, lambda s: user.sub(rf"\g<1>{SA_MARK}", s))

    def mark_deployment(self, deploy: Obj, services: set[str]) -> None:
        """The pod's ServiceAccount, and the file server Service workspaces reach the manager through."""
        pod = deploy["spec"]["template"]["spec"]
        if pod.get("serviceAccountName") != self.service_account:
            raise SystemExit("gen_helm: the manager pod names no serviceAccountName")
        pod["serviceAccountName"] = SA_MARK
        container = one([c for c in pod["containers"] if c["name"] == "manager"], "manager container")
        flag = "--program-fs-adv-addr="
        args = container.get("args", [])
        advs: list[str] = [a for a in args if a.startswith(flag)]
        if len(advs) != 1:
            raise SystemExit(f"gen_helm: the manager has {len(advs)} {flag} arguments, expected one")
        adv = advs[0]
        host, dot, rest = adv.removeprefix(flag).partition(".")
        if not dot or host not in services:
            raise SystemExit(f"gen_helm: {adv} does not name a Service of config/ (<service>.<namespace>)")
        args[args.index(adv)] = flag + self.markers[host] + dot + rest


def replace_strings(obj: Any, change: Callable[[str], str]) -> Any:
    """Every string of ``obj`` (in place, for dicts and lists) passed through ``change``."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            obj[k] = replace_strings(v, change)
    elif isinstance(obj, list):
        obj[:] = [replace_strings(v, change) for v in obj]
    elif isinstance(obj, str):
        return change(obj)
    return obj
