"""A request body over the limit must be refused while it streams in.

Counting what ``receive`` delivers catches a body that is larger than its ``Content-Length``
claims, or that has none (chunked); an honest, too-large ``Content-Length`` is refused on the
first read, before any of the body is buffered. The refusal is a ``PayloadTooLarge`` raised
from ``receive`` into the handler, so the app's handlers answer with the usual 413
``ErrorBody`` (Starlette's own limit answers plain text instead).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import PayloadTooLarge

_MAX_LENGTH_DIGITS = 18


class BodyLimitMiddleware:
    """Raise ``PayloadTooLarge`` from ``receive`` once a request body exceeds ``max_bytes``."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        received = 0

        async def limited() -> Message:
            nonlocal received
            if declared > self.max_bytes:
                raise self._too_large()
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise self._too_large()
            return message

        await self.app(scope, limited, send)

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"request body exceeds {self.max_bytes} bytes; send a smaller body")


def _declared_length(scope: Scope) -> int:
    # Start the count at 0 for an absent or unreadable header: the stream count decides then;
    # a declared length above the limit is refused before reading anything. Digits are
    # counted before int(): thousands of them would raise (and no body is that long anyway).
    for name, value in scope["headers"]:
        if name == b"content-length":
            if not value.isdigit():
                return 0
            return int(value) if len(value) <= _MAX_LENGTH_DIGITS else 1 << 63
    return 0
