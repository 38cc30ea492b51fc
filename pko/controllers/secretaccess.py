"""What the operator says when the apiserver refuses it a Secret or ConfigMap (403): the
secrets-per-namespace install (config/components/secrets-per-namespace, the chart's
``rbac.secretsPerNamespace``) grants Secret and ConfigMap rights only where the platform team binds
that install's ClusterRole to the operator's ServiceAccount; a refusal names that binding.

The one mechanism: :class:`SecretAccess` (the operator's account and the ClusterRole's name, as the
operator was told them: ``--stack-secrets-role``, which the chart sets to the name it gives the role)
words every refusal (:meth:`SecretAccess.forbidden`), and :meth:`SecretAccess.get_or_none` reads
one object, a refusal raised as :class:`SecretForbidden` with those words."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from pko import defaults
from pko.machinery.kubeclient import ApiException
from pko.machinery.resource import Obj, ResourceClient, api_error_status

if TYPE_CHECKING:
    from pko.controllers.options import ControllerOptions

__all__ = [
    "SECRET_FORBIDDEN_REASON",
    "STACK_SECRETS_ROLE",
    "SecretAccess",
    "SecretForbidden",
]

# The ClusterRole of the secrets-per-namespace install, as config/ names it (the default of
# --stack-secrets-role; the chart renames it with nameOverride/fullnameOverride and says so).
STACK_SECRETS_ROLE: Final = defaults.STACK_SECRETS_ROLE
# The Stalled reason (a Stack) or Warning Event reason (a Stack, an Update) of a refused Secret.
SECRET_FORBIDDEN_REASON: Final = "SecretForbidden"


class SecretForbidden(Exception):
    """A Secret or ConfigMap read the apiserver refused (403); the message says what to bind."""

    reason: Final = SECRET_FORBIDDEN_REASON


@dataclass(frozen=True, slots=True)
class SecretAccess:
    """Who the operator is (``account``: its ServiceAccount as ``<namespace>/<name>``; "": unnamed)
    and the ClusterRole that grants it Secrets and ConfigMaps per namespace (``role``)."""

    account: str = ""
    role: str = STACK_SECRETS_ROLE

    @classmethod
    def of(cls, options: ControllerOptions) -> SecretAccess:
        """The operator's, from its options."""
        return cls(
            f"{options.operator_namespace}/{options.operator_service_account}", options.stack_secrets_role
        )

    def forbidden(
        self, namespace: str | None, name: str, context: str = "", verb: str = "read", kind: str = "Secret"
    ) -> str:
        """The message of a request the apiserver refused (403): what to bind, to whom, where.
        ``context`` prefixes it; ``verb``: what the operator may not do (read, create); ``kind``:
        Secret or ConfigMap (the role grants both)."""
        account = f"ServiceAccount {self.account}" if self.account else "the operator's ServiceAccount"
        return (
            f"{context}the operator may not {verb} {kind} {namespace}/{name} (403 Forbidden): bind "
            f"ClusterRole {self.role} to {account} in namespace {namespace} with a RoleBinding "
            "(docs/install.md, Secrets per namespace)"
        )

    async def get_or_none(
        self, client: ResourceClient, name: str, namespace: str | None, context: str = ""
    ) -> Obj | None:
        """``client``'s object (a Secret or ConfigMap) by name, None when there is none; a refusal
        (403) raised as :class:`SecretForbidden`, worded by :meth:`forbidden`."""
        try:
            return await client.get_or_none(name, namespace)
        except ApiException as exc:
            if api_error_status(exc) != 403:
                raise
            kind = client.resource.kind
            raise SecretForbidden(self.forbidden(namespace, name, context, kind=kind)) from exc
