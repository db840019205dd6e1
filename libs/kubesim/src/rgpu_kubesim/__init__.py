"""rgpu's simulated Kubernetes cluster: a real apiserver on loopback, for tests and the demo.

``run_apiserver`` serves core/v1 namespaces, nodes, pods (+status, +binding, +eviction),
configmaps, events and serviceaccounts (+token), coordination.k8s.io/v1 leases,
scheduling.k8s.io/v1 priorityclasses, policy/v1 poddisruptionbudgets, authentication.k8s.io/v1
tokenreviews, rbac.authorization.k8s.io/v1 roles and bindings, authorization.k8s.io/v1 access
reviews, networking.k8s.io/v1 networkpolicies (enforced in front of fake lupine servers by
``PodNetwork``) and admissionregistration.k8s.io/v1 mutating- and
validatingwebhookconfigurations and validatingadmissionpolicies (+bindings) with
kube-apiserver's semantics (resourceVersions, selectors, watches, patches, RBAC on every
request, admission webhooks and CEL, scheduling gates, bearer tokens, Status errors), so
unmodified clients (kubectl, kubernetes_asyncio) work against it.
"""

from __future__ import annotations

from rgpu_kubesim._lupine_errors import (
    AddressUnavailable,
    LupineNotFound,
    SimOptionError,
    SimSetupError,
)
from rgpu_kubesim.apiserver import (
    ApiOptions,
    Faults,
    RequestCount,
    RequestKey,
    RequestMeter,
    SimApiServer,
    Store,
    UserGrant,
    run_apiserver,
)
from rgpu_kubesim.certs import CertFiles, write_certs
from rgpu_kubesim.errors import ApiError, FaultSpecError, KubesimError
from rgpu_kubesim.fleet import (
    FleetPlan,
    FleetSpec,
    PodPlan,
    SeededFleet,
    WorkloadSpec,
    plan_fleet,
    plan_workload,
    seed_fleet,
)
from rgpu_kubesim.kubelet import KubeletConfig, KubeletEmulator, RunRecord
from rgpu_kubesim.lupine import FakeLupine, LupineFleet, LupineSpec, open_lupine_fleet, run_lupine
from rgpu_kubesim.machinery import Refusal, Refusals
from rgpu_kubesim.network import PodNetwork
from rgpu_kubesim.scheduler import PodRecord, SchedulerConfig, SchedulerEmulator, Step

__all__ = [
    "AddressUnavailable",
    "ApiError",
    "ApiOptions",
    "CertFiles",
    "FakeLupine",
    "FaultSpecError",
    "Faults",
    "FleetPlan",
    "FleetSpec",
    "KubeletConfig",
    "KubeletEmulator",
    "KubesimError",
    "LupineFleet",
    "LupineNotFound",
    "LupineSpec",
    "PodNetwork",
    "PodPlan",
    "PodRecord",
    "Refusal",
    "Refusals",
    "RequestCount",
    "RequestKey",
    "RequestMeter",
    "RunRecord",
    "SchedulerConfig",
    "SchedulerEmulator",
    "SeededFleet",
    "SimApiServer",
    "SimOptionError",
    "SimSetupError",
    "Step",
    "Store",
    "UserGrant",
    "WorkloadSpec",
    "open_lupine_fleet",
    "plan_fleet",
    "plan_workload",
    "run_apiserver",
    "run_lupine",
    "seed_fleet",
    "write_certs",
]
