"""The HTTP face of the simulated apiserver: the server and its ASGI app, routing of
requests to handlers, request decoding (JSON, protobuf, patches), responses (objects, lists,
tables, watches, Status), discovery and OpenAPI, metering and injected faults.
"""

from __future__ import annotations

from rgpu_kubesim.apiserver.endpoints._faults import (
    Faults,
)
from rgpu_kubesim.apiserver.endpoints._metering import (
    RequestCount,
    RequestKey,
    RequestMeter,
)
from rgpu_kubesim.apiserver.endpoints._server import (
    ApiOptions,
    SimApiServer,
    run_apiserver,
)

__all__ = [
    "ApiOptions",
    "Faults",
    "RequestCount",
    "RequestKey",
    "RequestMeter",
    "SimApiServer",
    "run_apiserver",
]
