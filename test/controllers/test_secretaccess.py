"""How a refused Secret or ConfigMap is worded (pko.controllers.secretaccess), pure: the role the
operator was told (``--stack-secrets-role``), its own account, the namespace; and what a Stack
reconcile plans when a read before deciding is refused (pko.controllers.stack.outputs.unreadable).
The real refusals: test_secrets_per_namespace (a real apiserver with RBAC)."""

from __future__ import annotations

from pko.controllers.options import ControllerOptions
from pko.controllers.secretaccess import SECRET_FORBIDDEN_REASON, STACK_SECRETS_ROLE, SecretAccess
from pko.controllers.stack.outputs import unreadable
from pko.controllers.stack.steps import Emit, Log
from pko.controllers.stack.waits import SECRET_RECHECK
from pko.machinery.controller import Result


def test_a_refusal_names_the_role_the_operator_was_told_its_account_and_the_namespace() -> None:
    told = SecretAccess.of(
        ControllerOptions(
            operator_namespace="ops", operator_service_account="pko", stack_secrets_role="team-pko-secrets"
        )
    )
    assert told == SecretAccess("ops/pko", "team-pko-secrets")
    assert told.forbidden("team-a", "git", "gitAuth: ") == (
        "gitAuth: the operator may not read Secret team-a/git (403 Forbidden): bind ClusterRole "
        "team-pko-secrets to ServiceAccount ops/pko in namespace team-a with a RoleBinding "
        "(docs/install.md, Secrets per namespace)"
    )
    assert "may not create ConfigMap team-a/out " in told.forbidden(
        "team-a", "out", verb="create", kind="ConfigMap"
    )
    # Told nothing: config/'s name for the role, and the account unnamed.
    assert SecretAccess.of(ControllerOptions()).role == STACK_SECRETS_ROLE == "pko-stack-secrets"
    assert "bind ClusterRole pko-stack-secrets to the operator's ServiceAccount in namespace team-a" in (
        SecretAccess().forbidden("team-a", "git")
    )


def test_a_refused_read_before_deciding_warns_and_looks_again_on_the_secret_timer() -> None:
    stack = {"metadata": {"name": "app", "namespace": "team-a"}}
    plan = unreadable(stack, "the operator may not read Secret team-a/x (403 Forbidden): ...", SECRET_RECHECK)
    assert plan.writes == [
        Emit(
            "Warning",
            SECRET_FORBIDDEN_REASON,
            "the operator may not read Secret team-a/x (403 Forbidden): ...",
        ),
        Log(
            "a Secret the Stack needs was refused", {"stack": "team-a/app", "reason": SECRET_FORBIDDEN_REASON}
        ),
    ]
    assert plan.result == Result.requeue_after(SECRET_RECHECK) and plan.status == {}
