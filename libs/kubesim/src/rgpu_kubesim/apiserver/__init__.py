"""The simulated kube-apiserver: storage, the rules of each kind, authentication and RBAC,
admission (webhooks and CEL policies), and the HTTP endpoints that serve them.

Outside code starts a server with ``run_apiserver`` and reaches objects in process through
``Store``; the rest stays inside, one concern per sub-package, each importing only those below
it: ``endpoints`` (the HTTP layer) over ``admission`` and ``auth`` over ``storage`` over
``kinds``, all over the shared ``rgpu_kubesim.machinery``.
"""

from __future__ import annotations

from rgpu_kubesim.apiserver.auth import UserGrant
from rgpu_kubesim.apiserver.endpoints import (
    ApiOptions,
    Faults,
    RequestCount,
    RequestKey,
    RequestMeter,
    SimApiServer,
    run_apiserver,
)
from rgpu_kubesim.apiserver.storage import Store

__all__ = [
    "ApiOptions",
    "Faults",
    "RequestCount",
    "RequestKey",
    "RequestMeter",
    "SimApiServer",
    "Store",
    "UserGrant",
    "run_apiserver",
]
