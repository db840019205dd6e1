"""One process, two surfaces: the webhook listener is open to the whole cluster network (the
apiserver's address differs per cluster), so it must offer nothing but ``/mutate`` and health;
a scheduler verb reachable there would let anyone book a server and bind a pod to it. The
scheduler listener offers the verbs, health and ``/metrics``, and never ``/mutate``.

Each listener serves the one app (one lifespan, one registry, one set of handlers) through a
``Surface``: an allow-list of paths, everything else a 404 before any handler runs, and its own
body limit enforced while the body streams in, sized for what legitimately arrives there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from rgpu_contracts import ErrorBody
from rgpu_runtime.serving import BodyLimitMiddleware, json_response

from .webhookguard import webhook_guard

__all__ = [
    "HEALTH_PATHS",
    "SCHEDULER_PATHS",
    "WEBHOOK_MAX_BODY_BYTES",
    "WEBHOOK_PATHS",
    "Surface",
    "scheduler_surface",
    "webhook_surface",
]

HEALTH_PATHS = frozenset({"/healthz", "/readyz"})
SCHEDULER_PATHS = HEALTH_PATHS | {"/filter", "/prioritize", "/bind", "/metrics"}
WEBHOOK_PATHS = HEALTH_PATHS | {"/mutate"}

WEBHOOK_MAX_BODY_BYTES = (3 << 20) + (3 << 19) + (64 << 10)
"""The body limit of the webhook's ``/mutate``: the apiserver refuses requests over 3 MiB, so the
``object`` it sends is at most that; an UPDATE also carries ``oldObject``, at most what etcd
stores (1.5 MiB); 64 KiB covers the review's envelope and userInfo. Anything larger did not
come from the apiserver and is refused while it streams in."""


@dataclass(frozen=True, slots=True)
class Surface:
    """What one listener serves of ``app``: ``paths`` only, bodies up to ``max_body_bytes``."""

    app: ASGIApp
    name: str
    paths: frozenset[str]
    max_body_bytes: int
    setting: str | None = None
    """The setting that raises ``max_body_bytes``, named in the refusal."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
        elif scope["path"] in self.paths:
            limited = BodyLimitMiddleware(
                self.app, max_bytes=self.max_body_bytes, setting=self.setting
            )
            await limited(scope, receive, send)
        else:
            await self._not_here(scope, receive, send)

    async def _not_here(self, scope: Scope, receive: Receive, send: Send) -> None:
        served = ", ".join(sorted(self.paths))
        message = (
            f"no route for {scope['method']} {scope['path']} on the extender's {self.name} "
            f"listener, which serves {served} only"
        )
        body = ErrorBody(code="not_found", message=message, retryable=False)
        await json_response(body.to_dict(), 404)(scope, receive, send)


def scheduler_surface(max_body_bytes: int) -> Callable[[ASGIApp], ASGIApp]:
    """The scheduler listener's face: verbs, health, metrics (``RGPU_SCHEDULER_MAX_BODY_BYTES``)."""
    return lambda app: Surface(
        app, "scheduler", SCHEDULER_PATHS, max_body_bytes, "RGPU_SCHEDULER_MAX_BODY_BYTES"
    )


def webhook_surface(*, require_client_cert: bool = False) -> Callable[[ASGIApp], ASGIApp]:
    """The webhook listener's face: ``/mutate`` and health, bodies of an AdmissionReview's size,
    reviews rationed per client address and, when asked, only the apiserver's client
    certificate (``webhookguard``)."""
    guard = webhook_guard(require_client_cert=require_client_cert)
    return lambda app: Surface(guard(app), "webhook", WEBHOOK_PATHS, WEBHOOK_MAX_BODY_BYTES)
