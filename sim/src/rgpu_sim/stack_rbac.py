"""rgpu's own access control, applied to the simulated cluster from the manifests a real one gets.

The ServiceAccounts, Roles, ClusterRoles, bindings and ValidatingAdmissionPolicies of
``k8s/base`` are read from the files themselves (not copied into code), so a grant missing
there fails in the simulator as it would in a cluster; ``tests/test_manifests.py`` holds them
equal to what ``kubectl kustomize`` renders. The services reach the simulated apiserver as their
accounts, and every simulated user gets ``edit`` everywhere but in the system namespaces.

One grant is the simulator's own: each service mints its tokens through TokenRequest because
no kubelet projects them (a kubelet may, for the pods on its node). ``projected_tokens`` stands
in for that, as one Role per account limited by ``resourceNames`` to the account itself: no
service can mint another's token.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from rgpu_kubesim import Refusal, SimApiServer, Store, UserGrant
from rgpu_kubesim.network import LUPINE_NAMESPACE

from .checks import CheckResult

__all__ = [
    "K8S",
    "PLURALS",
    "SYSTEM_NAMESPACE",
    "apply_rbac",
    "check_authorized",
    "manifests",
    "refused",
    "user_grant",
]

SYSTEM_NAMESPACE = "rgpu-system"
K8S = Path(__file__).resolve().parents[3] / "k8s"
"""The repository's k8s/ (the proving ground runs from its uv workspace)."""
PLURALS = {
    "ServiceAccount": "serviceaccounts",
    "ClusterRole": "clusterroles",
    "Role": "roles",
    "ClusterRoleBinding": "clusterrolebindings",
    "RoleBinding": "rolebindings",
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
}
"""The kinds applied, in the order a cluster needs them (accounts and roles before bindings)."""

Obj = dict[str, Any]


def manifests(k8s: Path = K8S, part: str = "base") -> list[Obj]:
    """Every object of ``PLURALS``' kinds in ``k8s/<part>`` (``base``, or a component such as
    ``components/server-policies``), in ``PLURALS`` order."""
    base = k8s / part
    if not base.is_dir():
        raise FileNotFoundError(
            f"{base} is missing: the simulated stack applies rgpu's RBAC from the repository's "
            "k8s/ directory; run it from a checkout of rgpu"
        )
    found = [o for path in sorted(base.rglob("*.yaml")) for o in _documents(path)]
    chosen = [o for o in found if o.get("kind") in PLURALS]
    order = list(PLURALS)
    return sorted(chosen, key=lambda o: order.index(o["kind"]))


def _documents(path: Path) -> Iterator[Obj]:
    for document in yaml.safe_load_all(path.read_text()):
        if isinstance(document, dict):
            yield document


def projected_tokens(accounts: Iterable[str]) -> Iterator[tuple[str, Obj]]:
    """(plural, object) pairs letting each account mint tokens for itself only."""
    for account in accounts:
        name = f"kubesim:projected-token:{account}"
        meta = {"name": name, "namespace": SYSTEM_NAMESPACE}
        rule = {
            "apiGroups": [""],
            "resources": ["serviceaccounts/token"],
            "resourceNames": [account],
            "verbs": ["create"],
        }
        yield "roles", {"metadata": meta, "rules": [rule]}
        ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
        subject = {"kind": "ServiceAccount", "name": account, "namespace": SYSTEM_NAMESPACE}
        yield "rolebindings", {"metadata": meta, "roleRef": ref, "subjects": [subject]}


def apply_rbac(store: Store, k8s: Path = K8S, part: str = "base") -> list[Obj]:
    """Create rgpu's RBAC and admission policies of ``k8s/<part>`` in ``store`` (their
    namespaces must exist), and the projected-token stand-in for the accounts it declares;
    returns the objects read from k8s/."""
    objects = manifests(k8s, part)
    for obj in objects:
        store.create(PLURALS[obj["kind"]], obj)
    accounts = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
    for plural, obj in projected_tokens(accounts):
        store.create(plural, obj)
    return objects


def user_grant() -> UserGrant:
    """Simulated users get ``edit`` in every namespace but kube's and rgpu's own (its services'
    and its lupine servers', where ``edit`` would let a tenant rewrite the servers' policies)."""
    ours = {SYSTEM_NAMESPACE, LUPINE_NAMESPACE}
    return UserGrant(except_namespaces=UserGrant().except_namespaces | ours)


def refused(sim: SimApiServer) -> tuple[Refusal, ...]:
    """What the simulated apiserver refused rgpu's own accounts (RBAC or admission policy):
    empty unless k8s/ lacks a grant the code needs (or a test impersonated an account)."""
    return sim.refusals.of(f"system:serviceaccount:{SYSTEM_NAMESPACE}:rgpu-")


def check_authorized(sim: SimApiServer) -> CheckResult:
    """The soak's check that rgpu's RBAC in k8s/ grants everything the services did."""
    found = refused(sim)
    return CheckResult(
        name="every API request of rgpu's accounts was authorized (k8s/ RBAC)",
        passed=not found,
        detail="; ".join(r.describe() for r in found[:5]),
    )
