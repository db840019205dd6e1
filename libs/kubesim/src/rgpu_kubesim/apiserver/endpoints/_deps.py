"""What the REST handlers need, built once per server: storage, faults, admission, auth and
the request meter, in one value so a handler's reach is visible in one place."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rgpu_kubesim.apiserver.admission import Admission, AdmissionPolicies
from rgpu_kubesim.apiserver.auth import Authenticator, Authorizer
from rgpu_kubesim.apiserver.endpoints._faults import Faults
from rgpu_kubesim.apiserver.endpoints._metering import RequestMeter
from rgpu_kubesim.apiserver.storage import Storage

__all__ = ["Deps"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Deps:
    """What handlers need; built once per server."""

    storage: Storage
    faults: Faults
    admission: Admission
    default_user: str
    bookmark_interval: float
    user_agents: Mapping[str, str] = field(default_factory=dict)
    clock: Callable[[], float] = time.time
    authn: Authenticator
    authorizer: Authorizer
    """RBAC: who the requester is and what it may do."""
    policies: AdmissionPolicies
    """ValidatingAdmissionPolicies, enforced on writes after the mutating webhooks."""
    meter: RequestMeter = field(default_factory=RequestMeter)
    """Counts requests and bytes by client, verb and resource."""
