"""One process may serve one app on several sockets (the extender's
plain HTTP and TLS webhook), and the app's lifespan must run exactly once for all of them.

``app_lifespan`` drives the ASGI lifespan protocol itself and yields the state the app's
lifespan produced; ``with_state`` hands a copy of that state to every request, as uvicorn
would, so servers can run with their own lifespan handling switched off. Driving it here
also keeps the original exception when startup fails (uvicorn would log it and exit),
so ``main`` can report a ``SettingsError`` raised by, say, ``kube_client`` properly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from anyio.abc import ObjectReceiveStream
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._groups import lone_errors

SHUTDOWN_SECONDS = 2.0
"""Seconds the app's shutdown may take before its lifespan is cancelled: our shutdowns only
cancel their task groups and close clients, and a service must be gone within about 5 s of
SIGTERM (requests get ``_listeners.DRAIN_SECONDS`` before this)."""


class LifespanError(RuntimeError):
    """Raised when the app reports a lifespan failure without raising an exception."""


@asynccontextmanager
async def app_lifespan(app: ASGIApp) -> AsyncIterator[dict[str, Any]]:
    """Run ``app``'s startup, yield its lifespan state, run its shutdown on exit."""
    state: dict[str, Any] = {}
    scope: Scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": state}
    to_app, app_inbox = anyio.create_memory_object_stream[Message](1)
    app_outbox, from_app = anyio.create_memory_object_stream[Message](1)
    failure: list[BaseException] = []

    async def run_app() -> None:
        async with app_outbox:
            try:
                await app(scope, app_inbox.receive, app_outbox.send)
            except Exception as exc:
                failure.append(exc)

    with lone_errors():
        async with anyio.create_task_group() as tg, to_app, from_app, app_inbox:
            tg.start_soon(run_app)
            await to_app.send({"type": "lifespan.startup"})
            await _expect(from_app, "lifespan.startup.complete", failure)
            try:
                yield state
            finally:
                # Shut down even when serving failed or was cancelled, so clients close cleanly;
                # bounded, so a stuck shutdown cannot keep a terminating pod alive forever.
                with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_SECONDS):
                    await to_app.send({"type": "lifespan.shutdown"})
                    await _expect(from_app, "lifespan.shutdown.complete", failure)
                tg.cancel_scope.cancel()


async def _expect(
    inbox: ObjectReceiveStream[Message], wanted: str, failure: list[BaseException]
) -> None:
    try:
        message = await inbox.receive()
    except anyio.EndOfStream:
        message = {"type": "ended", "message": "the app returned during its lifespan"}
    if message["type"] == wanted:
        return
    # A failing app reports, then raises: drain until it ends so its exception is captured.
    async for _ in inbox:
        pass
    if failure:
        raise failure[0]
    raise LifespanError(f"{wanted} expected, got {message['type']}: {message.get('message', '')}")


def with_state(app: ASGIApp, state: dict[str, Any]) -> ASGIApp:
    """Give every request a shallow copy of the lifespan ``state``, as ASGI servers do."""

    async def stateful(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope["state"] = dict(state)
        await app(scope, receive, send)

    return stateful
