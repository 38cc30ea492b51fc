"""What the operator says when the apiserver refuses it a Secret (403): the secrets-per-namespace
install (config/components/secrets-per-namespace, the chart's ``rbac.secretsPerNamespace``) grants
Secret and ConfigMap rights only where the platform team binds the ClusterRole
:data:`STACK_SECRETS_ROLE` to the operator's ServiceAccount; a refusal names that binding."""

from __future__ import annotations

from typing import Final

__all__ = ["SECRET_FORBIDDEN_REASON", "STACK_SECRETS_ROLE", "forbidden_secret"]

# The ClusterRole of the secrets-per-namespace install.
STACK_SECRETS_ROLE: Final = "pko-stack-secrets"
# The Stalled reason (a Stack) or Warning Event reason (an Update) of a refused Secret.
SECRET_FORBIDDEN_REASON: Final = "SecretForbidden"


def forbidden_secret(
    namespace: str | None, name: str, operator_account: str = "", context: str = "", verb: str = "read"
) -> str:
    """The message of a Secret request the apiserver refused (403): what to bind, to whom, where.
    ``operator_account``: the operator's ServiceAccount as ``<namespace>/<name>`` ("": unnamed);
    ``context`` prefixes the message; ``verb``: what the operator may not do (read, create)."""
    account = f"ServiceAccount {operator_account}" if operator_account else "the operator's ServiceAccount"
    return (
        f"{context}the operator may not {verb} Secret {namespace}/{name} (403 Forbidden): bind ClusterRole "
        f"{STACK_SECRETS_ROLE} to {account} in namespace {namespace} with a RoleBinding "
        "(docs/install.md, Secrets per namespace)"
    )
