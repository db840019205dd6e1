"""Role-based access control as kube-apiserver's RBAC authorizer decides it.

A request is allowed when some rule reached through a binding that names the requester (as a
User, as one of its Groups, or as the ServiceAccount it is) covers the request's verb, API
group, resource (with its subresource) and, where the rule lists ``resourceNames``, its object
name. ClusterRoleBindings apply everywhere, RoleBindings in their own namespace only; nothing
ever denies, so a request no rule allows is forbidden. A binding to a role that does not exist
grants nothing, as in kube.

``RuleIndex`` maps each subject to the rules it reaches, built once from the stored objects
after an RBAC write, so a decision costs the requester's few rules, whatever the number of
bindings in the cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

RBAC_GROUP = "rbac.authorization.k8s.io"
RBAC_PLURALS = ("roles", "rolebindings", "clusterroles", "clusterrolebindings")
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
_ALL = "*"

SubjectKey = tuple[str, str]
"""("User", name) or ("Group", name); a ServiceAccount subject is the User it authenticates as."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """kube's authorizer.Attributes: what a request asks to do (``path`` set: non-resource)."""

    verb: str
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""

    @property
    def is_resource(self) -> bool:
        return not self.path

    @property
    def combined(self) -> str:
        """``pods`` or ``pods/status``: what a rule's ``resources`` entry names."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyRule:
    """One rule of a Role or ClusterRole."""

    verbs: frozenset[str]
    groups: frozenset[str] = frozenset()
    resources: tuple[str, ...] = ()
    names: frozenset[str] = frozenset()
    urls: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> PolicyRule:
        return cls(
            verbs=frozenset(_strings(raw.get("verbs"))),
            groups=frozenset(_strings(raw.get("apiGroups"))),
            resources=tuple(_strings(raw.get("resources"))),
            names=frozenset(_strings(raw.get("resourceNames"))),
            urls=tuple(_strings(raw.get("nonResourceURLs"))),
        )

    def to_dict(self) -> dict[str, Any]:
        """The rule as the API writes it (lists sorted, empty fields left out)."""
        body: dict[str, Any] = {"verbs": sorted(self.verbs)}
        if self.urls:
            body["nonResourceURLs"] = list(self.urls)
            return body
        body["apiGroups"] = sorted(self.groups)
        body["resources"] = list(self.resources)
        if self.names:
            body["resourceNames"] = sorted(self.names)
        return body

    def covers(self, request: Request) -> bool:
        """Whether this rule allows ``request`` for some object name (resourceNames aside)."""
        if not (_ALL in self.verbs or request.verb in self.verbs):
            return False
        if not request.is_resource:
            return any(_url_matches(url, request.path) for url in self.urls)
        return (_ALL in self.groups or request.group in self.groups) and any(
            _resource_matches(entry, request) for entry in self.resources
        )


def _strings(raw: object) -> list[str]:
    return [str(v) for v in raw] if isinstance(raw, list) else []


def _resource_matches(entry: str, request: Request) -> bool:
    """kube's ResourceMatches: ``*``, the exact ``resource[/subresource]``, or ``*/<sub>``."""
    if entry in (_ALL, request.combined):
        return True
    return bool(request.subresource) and entry == f"*/{request.subresource}"


def _url_matches(url: str, path: str) -> bool:
    if url in (_ALL, path):
        return True
    return url.endswith(_ALL) and path.startswith(url[:-1])


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """A rule the requester reaches, and how (kube's reason for an allowed request)."""

    rule: PolicyRule
    source: str


AllowedNames = frozenset[str] | None
"""The object names a requester may address for one kind of request: None for every name."""


def allowed_names(rules: Iterable[PolicyRule], request: Request) -> AllowedNames:
    """The names ``rules`` allow ``request`` for: None as soon as one rule lists no names."""
    names: set[str] = set()
    for rule in rules:
        if rule.covers(request):
            if not rule.names:
                return None
            names |= rule.names
    return frozenset(names)


def first_allowing(grants: Iterable[Grant], request: Request) -> Grant | None:
    """The first grant that allows ``request`` (its name included), or None."""
    for grant in grants:
        rule = grant.rule
        if rule.covers(request) and (not rule.names or request.name in rule.names):
            return grant
    return None


def service_account_user(namespace: str, name: str) -> str:
    return f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"


def service_account_of(username: str) -> tuple[str, str] | None:
    """(namespace, name) of a ``system:serviceaccount:<ns>:<name>`` user, else None."""
    if not username.startswith(SERVICE_ACCOUNT_PREFIX):
        return None
    namespace, colon, name = username[len(SERVICE_ACCOUNT_PREFIX) :].partition(":")
    return (namespace, name) if colon and namespace and name and ":" not in name else None


def service_account_groups(namespace: str) -> tuple[str, ...]:
    """The groups kube's service-account authenticator gives an account of ``namespace``."""
    return ("system:serviceaccounts", f"system:serviceaccounts:{namespace}")


@dataclass(slots=True)
class _Binding:
    kind: str
    name: str
    namespace: str
    role_kind: str
    role_name: str
    subjects: list[tuple[SubjectKey, str]] = field(default_factory=list)
    """(subject, kube's description of it) for every subject the binding names."""


Bound = tuple[tuple[PolicyRule, ...], str]
"""A role's rules as one binding grants them, and kube's description of that grant."""


class RuleIndex:
    """Every binding's rules, by the subject it names; built from decoded objects (a role's
    rules are parsed once and shared by every binding of it)."""

    def __init__(
        self,
        *,
        cluster_roles: Iterable[Mapping[str, Any]],
        roles: Iterable[Mapping[str, Any]],
        cluster_bindings: Iterable[Mapping[str, Any]],
        bindings: Iterable[Mapping[str, Any]],
    ) -> None:
        self._cluster_roles = {_meta(r)[1]: _rules(r) for r in cluster_roles}
        self._roles = {_meta(r): _rules(r) for r in roles}
        self._cluster: dict[SubjectKey, list[Bound]] = {}
        self._namespaced: dict[tuple[str, SubjectKey], list[Bound]] = {}
        for raw in cluster_bindings:
            self._add(_binding("ClusterRoleBinding", raw))
        for raw in bindings:
            self._add(_binding("RoleBinding", raw))

    def _add(self, binding: _Binding) -> None:
        rules = self._role_rules(binding)
        for subject, described in binding.subjects:
            if binding.kind == "ClusterRoleBinding":
                label = f'ClusterRoleBinding "{binding.name}"'
                target = self._cluster.setdefault(subject, [])
            else:
                label = f'RoleBinding "{binding.name}/{binding.namespace}"'
                target = self._namespaced.setdefault((binding.namespace, subject), [])
            source = f'{label} of {binding.role_kind} "{binding.role_name}" to {described}'
            target.append((rules, source))

    def _role_rules(self, binding: _Binding) -> tuple[PolicyRule, ...]:
        if binding.role_kind == "ClusterRole":
            return self._cluster_roles.get(binding.role_name, ())
        if binding.kind == "RoleBinding" and binding.role_kind == "Role":
            return self._roles.get((binding.namespace, binding.role_name), ())
        return ()

    def bound(self, user: str, groups: Iterable[str], namespace: str) -> Iterator[Bound]:
        """The role grants reaching ``user`` (and its ``groups``) in ``namespace`` ("": the
        cluster scope only)."""
        keys = [("User", user), *(("Group", g) for g in groups)]
        for key in keys:
            yield from self._cluster.get(key, ())
        if namespace:
            for key in keys:
                yield from self._namespaced.get((namespace, key), ())

    def rules(self, user: str, groups: Iterable[str], namespace: str) -> Iterator[PolicyRule]:
        for rules, _ in self.bound(user, groups, namespace):
            yield from rules

    def grants(self, user: str, groups: Iterable[str], namespace: str) -> Iterator[Grant]:
        """Each rule reaching the user, with the grant it comes through."""
        for rules, source in self.bound(user, groups, namespace):
            for rule in rules:
                yield Grant(rule=rule, source=source)


def _meta(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _rules(role: Mapping[str, Any]) -> tuple[PolicyRule, ...]:
    return tuple(PolicyRule.parse(r) for r in role.get("rules") or () if isinstance(r, dict))


def _binding(kind: str, raw: Mapping[str, Any]) -> _Binding:
    namespace, name = _meta(raw)
    ref = raw.get("roleRef") or {}
    binding = _Binding(
        kind=kind,
        name=name,
        namespace=namespace,
        role_kind=str(ref.get("kind") or ""),
        role_name=str(ref.get("name") or ""),
    )
    for subject in raw.get("subjects") or ():
        resolved = _subject(subject, namespace) if isinstance(subject, dict) else None
        if resolved is not None:
            binding.subjects.append(resolved)
    return binding


def _subject(subject: Mapping[str, Any], binding_namespace: str) -> tuple[SubjectKey, str] | None:
    """kube's appliesTo: a ServiceAccount without a namespace is the binding's namespace's."""
    kind, name = str(subject.get("kind") or ""), str(subject.get("name") or "")
    if kind == "ServiceAccount":
        namespace = str(subject.get("namespace") or binding_namespace)
        user = service_account_user(namespace, name)
        return ("User", user), f'ServiceAccount "{name}/{namespace}"'
    if kind in ("User", "Group"):
        return (kind, name), f'{kind} "{name}"'
    return None
