"""A service's HTTP edge and its process: the app factory with health, readiness,
metrics and JSON errors; body limits; the listeners with their connection and head limits;
graceful draining; and ``run_service``, every service's ``main()``.
"""

from __future__ import annotations

from ._app import create_service_app
from ._bodylimit import BodyLimitMiddleware, body_limit
from ._edge import json_response, read_json, state_value
from ._limits import LISTENER_METRICS_STATE, ListenerMetrics
from ._listeners import Listener, running
from ._main import run_service
from ._readiness import Readiness, Standing
from ._uvicorn import EmbeddedServer

__all__ = [
    "LISTENER_METRICS_STATE",
    "BodyLimitMiddleware",
    "EmbeddedServer",
    "Listener",
    "ListenerMetrics",
    "Readiness",
    "Standing",
    "body_limit",
    "create_service_app",
    "json_response",
    "read_json",
    "run_service",
    "running",
    "state_value",
]
