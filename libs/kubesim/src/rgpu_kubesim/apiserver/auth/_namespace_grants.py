"""Every simulated user's rights in the namespaces where teams work, bound as each one appears.

A real cluster hands its teams a role in their namespaces (an admin's RoleBinding, a
namespace-provisioning controller); the simulated cluster does the same for the users it is
told about by name (group ``kubesim:users``): one RoleBinding of ``UserGrant.cluster_role``
(``edit``) in every namespace but the system ones, written in the same step that creates the
namespace, so a pod created right after its namespace is already authorized. Delete the
RoleBinding, or pass ``ApiOptions(user_grant=None)``, for a namespace where users have nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from rgpu_kubesim.apiserver.auth._authorization import SIM_USERS
from rgpu_kubesim.apiserver.storage import ADDED, Change, Storage
from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import Entry, require

_NAMESPACES = require("namespaces")
_BINDINGS = require("rolebindings")
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})


@dataclass(frozen=True, slots=True, kw_only=True)
class UserGrant:
    """The ClusterRole every simulated user gets in each namespace outside ``except_namespaces``."""

    cluster_role: str = "edit"
    """kube's aggregated ``edit``: pods, configmaps, evictions...; no RBAC, no Leases, no
    ``pods/status``, no tokens, nothing cluster-scoped."""
    except_namespaces: frozenset[str] = SYSTEM_NAMESPACES
    """Where users get nothing: kube's own namespaces (and, for rgpu, its system namespace)."""

    @property
    def group(self) -> str:
        """Who is granted: every user named by ``X-Sim-User`` (no service account)."""
        return SIM_USERS

    @property
    def binding_name(self) -> str:
        return f"{SIM_USERS}:{self.cluster_role}"


class NamespaceGrants:
    """Binds ``grant`` in every namespace that exists or is created."""

    def __init__(self, storage: Storage, grant: UserGrant) -> None:
        self._storage = storage
        self._grant = grant
        storage.observe(_NAMESPACES.plural, self._changed)
        for entry in list(storage.entries(_NAMESPACES)):
            self._bind(entry)

    def _changed(self, change: Change) -> None:
        if change.kind == ADDED:
            self._bind(change.entry)

    def _bind(self, namespace: Entry) -> None:
        grant = self._grant
        if namespace.name in grant.except_namespaces:
            return
        binding = {
            "metadata": {"name": grant.binding_name, "labels": {"kubesim.rgpu.io/grant": "users"}},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": grant.cluster_role,
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": SIM_USERS}
            ],
        }
        try:
            self._storage.create(_BINDINGS, namespace.name, binding)
        except ApiError as exc:
            if exc.code != 409:  # already bound (by an admin, before the grant was set up)
                raise
