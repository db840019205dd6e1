"""The resource kinds the simulated apiserver serves, and what each one's storage strategy is.

kube-apiserver decides per resource whether it is namespaced, which field selectors it accepts,
whether status is a separate subresource and whether an update must carry a resourceVersion.
Keeping those facts in one immutable table lets storage, routing, discovery and tables agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True, kw_only=True)
class Resource:
    """One served resource (a plural name in one API group/version)."""

    plural: str
    singular: str
    kind: str
    namespaced: bool
    group: str = ""
    version: str = "v1"
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    field_labels: tuple[str, ...] = ()
    """Field selector keys accepted besides metadata.name (and metadata.namespace if namespaced)."""
    status_is_subresource: bool = False
    """When true, a PUT/PATCH of the main resource keeps the stored status (kube's strategies)."""
    unconditional_update: bool = True
    """When false, a PUT without metadata.resourceVersion is rejected with 422 (Leases)."""
    delete_returns_object: bool = False
    verbs: tuple[str, ...] = ()
    """The verbs served when not all of them are (an empty tuple means every core verb)."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """The group-qualified name kube uses in messages: `pods`, `leases.coordination.k8s.io`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def selectable_fields(self) -> tuple[str, ...]:
        base = ("metadata.name", "metadata.namespace") if self.namespaced else ("metadata.name",)
        return base + self.field_labels


_CORE_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")

RESOURCES: tuple[Resource, ...] = (
    Resource(
        plural="namespaces",
        singular="namespace",
        kind="Namespace",
        namespaced=False,
        short_names=("ns",),
        subresources=("status", "finalize"),
        field_labels=("status.phase",),
        status_is_subresource=True,
        delete_returns_object=True,
    ),
    Resource(
        plural="nodes",
        singular="node",
        kind="Node",
        namespaced=False,
        short_names=("no",),
        subresources=("status",),
        field_labels=("spec.unschedulable",),
        status_is_subresource=True,
    ),
    Resource(
        plural="pods",
        singular="pod",
        kind="Pod",
        namespaced=True,
        short_names=("po",),
        categories=("all",),
        subresources=("status", "binding", "eviction"),
        field_labels=(
            "spec.nodeName",
            "spec.schedulerName",
            "spec.restartPolicy",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ),
        status_is_subresource=True,
        delete_returns_object=True,
    ),
    Resource(
        plural="configmaps",
        singular="configmap",
        kind="ConfigMap",
        namespaced=True,
        short_names=("cm",),
    ),
    Resource(
        plural="events",
        singular="event",
        kind="Event",
        namespaced=True,
        short_names=("ev",),
        field_labels=(
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ),
    ),
    Resource(
        plural="leases",
        singular="lease",
        kind="Lease",
        namespaced=True,
        group="coordination.k8s.io",
        unconditional_update=False,
    ),
    Resource(
        plural="mutatingwebhookconfigurations",
        singular="mutatingwebhookconfiguration",
        kind="MutatingWebhookConfiguration",
        namespaced=False,
        group="admissionregistration.k8s.io",
        categories=("api-extensions",),
    ),
    Resource(
        plural="validatingwebhookconfigurations",
        singular="validatingwebhookconfiguration",
        kind="ValidatingWebhookConfiguration",
        namespaced=False,
        group="admissionregistration.k8s.io",
        categories=("api-extensions",),
    ),
    Resource(
        plural="serviceaccounts",
        singular="serviceaccount",
        kind="ServiceAccount",
        namespaced=True,
        short_names=("sa",),
        subresources=("token",),
    ),
    Resource(
        plural="priorityclasses",
        singular="priorityclass",
        kind="PriorityClass",
        namespaced=False,
        group="scheduling.k8s.io",
        short_names=("pc",),
    ),
    Resource(
        plural="poddisruptionbudgets",
        singular="poddisruptionbudget",
        kind="PodDisruptionBudget",
        namespaced=True,
        group="policy",
        short_names=("pdb",),
        subresources=("status",),
        status_is_subresource=True,
    ),
    Resource(
        plural="networkpolicies",
        singular="networkpolicy",
        kind="NetworkPolicy",
        namespaced=True,
        group="networking.k8s.io",
        short_names=("netpol",),
    ),
    Resource(
        plural="tokenreviews",
        singular="tokenreview",
        kind="TokenReview",
        namespaced=False,
        group="authentication.k8s.io",
        verbs=("create",),
    ),
    *(
        Resource(
            plural=f"{singular}s",
            singular=singular,
            kind=kind,
            namespaced=kind.startswith("Role"),
            group="rbac.authorization.k8s.io",
        )
        for singular, kind in (
            ("role", "Role"),
            ("rolebinding", "RoleBinding"),
            ("clusterrole", "ClusterRole"),
            ("clusterrolebinding", "ClusterRoleBinding"),
        )
    ),
    *(
        Resource(
            plural=f"{singular}s",
            singular=singular,
            kind=kind,
            namespaced=kind.startswith("Local"),
            group="authorization.k8s.io",
            verbs=("create",),
        )
        for singular, kind in (
            ("selfsubjectaccessreview", "SelfSubjectAccessReview"),
            ("subjectaccessreview", "SubjectAccessReview"),
            ("localsubjectaccessreview", "LocalSubjectAccessReview"),
            ("selfsubjectrulesreview", "SelfSubjectRulesReview"),
        )
    ),
    Resource(
        plural="validatingadmissionpolicies",
        singular="validatingadmissionpolicy",
        kind="ValidatingAdmissionPolicy",
        namespaced=False,
        group="admissionregistration.k8s.io",
        categories=("api-extensions",),
        subresources=("status",),
        status_is_subresource=True,
    ),
    Resource(
        plural="validatingadmissionpolicybindings",
        singular="validatingadmissionpolicybinding",
        kind="ValidatingAdmissionPolicyBinding",
        namespaced=False,
        group="admissionregistration.k8s.io",
        categories=("api-extensions",),
    ),
)

SUBRESOURCE_KINDS: Mapping[str, str] = MappingProxyType(
    {
        "status": "",
        "finalize": "",
        "binding": "Binding",
        "token": "TokenRequest",
        "eviction": "Eviction",
    }
)
"""Kind served by a subresource; empty means the parent's kind."""

VERBS: tuple[str, ...] = _CORE_VERBS

_BY_PLURAL: Mapping[str, Resource] = MappingProxyType({r.plural: r for r in RESOURCES})


def by_plural(plural: str) -> Resource | None:
    """The resource served under `plural`, or None if the simulator does not serve it."""
    return _BY_PLURAL.get(plural)


def require(plural: str) -> Resource:
    """The resource served under ``plural``; KeyError for a name the simulator never serves."""
    return _BY_PLURAL[plural]


def group_versions() -> tuple[tuple[str, str], ...]:
    """Every (group, version) served, core group first."""
    seen: dict[tuple[str, str], None] = {}
    for resource in RESOURCES:
        seen.setdefault((resource.group, resource.version), None)
    return tuple(seen)


def in_group_version(group: str, version: str) -> tuple[Resource, ...]:
    return tuple(r for r in RESOURCES if r.group == group and r.version == version)


def lookup(group: str, version: str, plural: str) -> Resource | None:
    """The resource at /api(s)/<group>/<version>/<plural>, or None."""
    resource = _BY_PLURAL.get(plural)
    if resource is None or resource.group != group or resource.version != version:
        return None
    return resource
