"""A request body over the limit must be refused while it streams in.

Counting what ``receive`` delivers catches a body that is larger than its ``Content-Length``
claims, or that has none (chunked); an honest, too-large ``Content-Length`` is refused on the
first read, before any of the body is buffered. So a request never holds more than its limit
plus one chunk of the server's (uvicorn reads 64 KiB at a time). The refusal is a
``PayloadTooLarge`` raised from ``receive`` into the handler, so the app's handlers answer
with the usual 413 ``ErrorBody`` (Starlette's own limit answers plain text instead).

The app-wide middleware (``create_service_app``'s ``max_body_bytes``) is the ceiling; a route
that needs less puts ``body_limit(...)`` in its own ``middleware``. The limit a route applies
is named in the refusal together with the setting that raises it, when there is one.
"""

from __future__ import annotations

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rgpu_runtime.errors import PayloadTooLarge

__all__ = ["BodyLimitMiddleware", "body_limit"]

_MAX_LENGTH_DIGITS = 19
"""Content-Length values longer than this are beyond any limit; not worth converting."""


class BodyLimitMiddleware:
    """Raise ``PayloadTooLarge`` from ``receive`` once a request body exceeds ``max_bytes``."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, setting: str | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.setting = setting

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        oversized = _declared_length(scope) > self.max_bytes
        received = 0

        async def limited() -> Message:
            nonlocal received
            if oversized:
                raise self._too_large()
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise self._too_large()
            return message

        await self.app(scope, limited, send)

    def _too_large(self) -> PayloadTooLarge:
        fix = f" or raise {self.setting}" if self.setting else ""
        return PayloadTooLarge(
            f"request body exceeds this route's limit of {self.max_bytes} bytes; "
            f"send a smaller body{fix}"
        )


def body_limit(max_bytes: int, *, setting: str | None = None) -> Middleware:
    """Route middleware limiting that route's body to ``max_bytes`` (below the app's ceiling).

    ``setting`` names the key an operator changes to raise it (e.g. ``RGPU_MAX_BODY_BYTES``);
    leave it unset for a limit fixed by a protocol (an AdmissionReview's 3 MiB).
    """
    return Middleware(BodyLimitMiddleware, max_bytes=max_bytes, setting=setting)


def _declared_length(scope: Scope) -> int:
    # Start the count at 0 for an absent or unreadable header: the stream count decides then.
    # The digits are counted before int(): thousands of them are refused, not converted.
    for name, value in scope["headers"]:
        if name == b"content-length":
            if not value.isdigit():
                return 0
            return int(value) if len(value) <= _MAX_LENGTH_DIGITS else 1 << 63
    return 0
