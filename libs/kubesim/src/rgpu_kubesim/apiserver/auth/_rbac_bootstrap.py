"""The RBAC objects kube-apiserver creates at start (its bootstrap policy), those a simulated
cluster needs.

``cluster-admin`` for the ``system:masters`` group; the user-facing ``admin``, ``edit`` and
``view`` as kube aggregates them from ``system:aggregate-to-*`` (kube's rules for the core
resources and the groups most clusters serve, whether or not the simulator serves them: a rule
is only strings); ``system:basic-user`` (self access reviews) and ``system:discovery`` /
``system:public-info-viewer`` (the discovery and health paths) for every authenticated user;
``system:auth-delegator`` for whoever a cluster lets review tokens and access. Seeded once, on
an empty store, labelled as kube labels its own.
"""

from __future__ import annotations

from typing import Any

from rgpu_kubesim.apiserver.storage import Storage
from rgpu_kubesim.machinery import require

JsonObj = dict[str, Any]
MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
_BOOTSTRAPPING = {"kubernetes.io/bootstrapping": "rbac-defaults"}
_AUTOUPDATE = {"rbac.authorization.kubernetes.io/autoupdate": "true"}
_AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"
_READ = ("get", "list", "watch")
_WRITE = ("create", "delete", "deletecollection", "patch", "update")
_DISCOVERY_URLS: tuple[str, ...] = ("/api", "/api/*", "/apis", "/apis/*", "/healthz")
_DISCOVERY_URLS += ("/livez", "/openapi", "/openapi/*", "/readyz", "/version", "/version/")
_PUBLIC_URLS = ("/healthz", "/livez", "/readyz", "/version", "/version/")


def _rule(verbs: tuple[str, ...], group: str, *resources: str) -> JsonObj:
    return {"apiGroups": [group], "resources": list(resources), "verbs": list(verbs)}


def _urls(*urls: str) -> JsonObj:
    return {"nonResourceURLs": list(urls), "verbs": ["get"]}


def _role(name: str, rules: list[JsonObj], labels: dict[str, str] | None = None) -> JsonObj:
    meta = {
        "name": name,
        "labels": {**_BOOTSTRAPPING, **(labels or {})},
        "annotations": _AUTOUPDATE,
    }
    return {"metadata": meta, "rules": rules}


def _aggregated(name: str, selects: str, labels: dict[str, str] | None = None) -> JsonObj:
    role = _role(name, [], labels)
    selector = {"matchLabels": {f"{_AGGREGATE}{selects}": "true"}}
    return role | {"aggregationRule": {"clusterRoleSelectors": [selector]}}


def _view_rules() -> list[JsonObj]:
    return [
        _rule(_READ, "", "pods", "replicationcontrollers", "replicationcontrollers/scale"),
        _rule(_READ, "", "serviceaccounts", "services", "services/status", "endpoints"),
        _rule(_READ, "", "persistentvolumeclaims", "persistentvolumeclaims/status", "configmaps"),
        _rule(_READ, "", "limitranges", "resourcequotas", "bindings", "events", "pods/status"),
        _rule(_READ, "", "resourcequotas/status", "namespaces/status", "pods/log"),
        _rule(_READ, "", "replicationcontrollers/status", "namespaces"),
        _rule(_READ, "apps", "controllerrevisions", "statefulsets", "daemonsets", "deployments"),
        _rule(_READ, "apps", "replicasets", "statefulsets/scale", "deployments/scale"),
        _rule(_READ, "autoscaling", "horizontalpodautoscalers"),
        _rule(_READ, "batch", "jobs", "cronjobs", "jobs/status", "cronjobs/status"),
        _rule(_READ, "policy", "poddisruptionbudgets", "poddisruptionbudgets/status"),
        _rule(_READ, "networking.k8s.io", "networkpolicies", "ingresses", "ingresses/status"),
        _rule(_READ, "discovery.k8s.io", "endpointslices"),
    ]


def _edit_rules() -> list[JsonObj]:
    pods = ("pods", "pods/attach", "pods/proxy", "pods/exec", "pods/portforward")
    return [
        _rule(_READ, "", "pods/attach", "pods/proxy", "pods/exec", "pods/portforward", "secrets"),
        _rule(_READ, "", "services/proxy"),
        _rule(("impersonate",), "", "serviceaccounts"),
        _rule(_WRITE, "", *pods),
        _rule(("create",), "", "pods/eviction"),
        _rule(_WRITE, "", "replicationcontrollers", "replicationcontrollers/scale"),
        _rule(_WRITE, "", "serviceaccounts", "services", "services/proxy", "endpoints"),
        _rule(_WRITE, "", "persistentvolumeclaims", "configmaps", "secrets"),
        _rule(_WRITE, "apps", "statefulsets", "statefulsets/scale", "daemonsets", "deployments"),
        _rule(_WRITE, "apps", "deployments/scale", "replicasets", "replicasets/scale"),
        _rule(_WRITE, "autoscaling", "horizontalpodautoscalers"),
        _rule(_WRITE, "batch", "jobs", "cronjobs"),
        _rule(_WRITE, "policy", "poddisruptionbudgets"),
        _rule(_WRITE, "networking.k8s.io", "networkpolicies", "ingresses"),
    ]


def _admin_rules() -> list[JsonObj]:
    return [
        _rule(("create",), "authorization.k8s.io", "localsubjectaccessreviews"),
        _rule(_READ + _WRITE, "rbac.authorization.k8s.io", "roles", "rolebindings"),
    ]


def cluster_roles() -> list[JsonObj]:
    """kube's bootstrap ClusterRoles that a simulated cluster needs."""
    everything = [_rule(("*",), "*", "*"), {"nonResourceURLs": ["*"], "verbs": ["*"]}]
    return [
        _role("cluster-admin", everything),
        _aggregated("admin", "admin"),
        _aggregated("edit", "edit", {f"{_AGGREGATE}admin": "true"}),
        _aggregated("view", "view", {f"{_AGGREGATE}edit": "true"}),
        _role("system:aggregate-to-admin", _admin_rules(), {f"{_AGGREGATE}admin": "true"}),
        _role("system:aggregate-to-edit", _edit_rules(), {f"{_AGGREGATE}edit": "true"}),
        _role("system:aggregate-to-view", _view_rules(), {f"{_AGGREGATE}view": "true"}),
        _role(
            "system:basic-user",
            [
                _rule(
                    ("create",),
                    "authorization.k8s.io",
                    "selfsubjectaccessreviews",
                    "selfsubjectrulesreviews",
                )
            ],
        ),
        _role("system:discovery", [_urls(*_DISCOVERY_URLS)]),
        _role("system:public-info-viewer", [_urls(*_PUBLIC_URLS)]),
        _role(
            "system:auth-delegator",
            [
                _rule(("create",), "authentication.k8s.io", "tokenreviews"),
                _rule(("create",), "authorization.k8s.io", "subjectaccessreviews"),
            ],
        ),
    ]


def _cluster_binding(role: str, *groups: str) -> JsonObj:
    binding = _role(role, [])
    del binding["rules"]
    subjects = [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g} for g in groups
    ]
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}
    return binding | {"roleRef": ref, "subjects": subjects}


def cluster_role_bindings() -> list[JsonObj]:
    return [
        _cluster_binding("cluster-admin", MASTERS),
        _cluster_binding("system:basic-user", AUTHENTICATED),
        _cluster_binding("system:discovery", AUTHENTICATED),
        _cluster_binding("system:public-info-viewer", AUTHENTICATED, UNAUTHENTICATED),
    ]


def seed(storage: Storage) -> None:
    """Create the bootstrap policy (the aggregation controller, if running, fills the
    aggregated roles as they are written)."""
    roles, bindings = require("clusterroles"), require("clusterrolebindings")
    for role in cluster_roles():
        storage.create(roles, "", role)
    for binding in cluster_role_bindings():
        storage.create(bindings, "", binding)
