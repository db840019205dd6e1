"""Who is asking and may they: bearer-token authentication, the RBAC authorizer with its
bootstrap roles and ClusterRole aggregation, and the namespace grants tests hand out.
"""

from __future__ import annotations

from rgpu_kubesim.apiserver.auth._authn import (
    AUTHENTICATED_USER,
    Authenticator,
    BearerAuth,
    UserInfo,
)
from rgpu_kubesim.apiserver.auth._authorization import (
    Authorizer,
    NonResourceAuthorization,
    named_user,
)
from rgpu_kubesim.apiserver.auth._namespace_grants import (
    NamespaceGrants,
    UserGrant,
)
from rgpu_kubesim.apiserver.auth._rbac_aggregation import (
    Aggregator,
)
from rgpu_kubesim.apiserver.auth._rbac_bootstrap import (
    seed,
)

__all__ = [
    "AUTHENTICATED_USER",
    "Aggregator",
    "Authenticator",
    "Authorizer",
    "BearerAuth",
    "NamespaceGrants",
    "NonResourceAuthorization",
    "UserGrant",
    "UserInfo",
    "named_user",
    "seed",
]
