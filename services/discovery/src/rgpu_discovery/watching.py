"""The fleet is only as good as discovery's view of the Nodes, and
that view must survive everything the apiserver does — restarts, dropped watches, ``410
Expired``, minutes of downtime — without ever dropping the last good fleet.

The runtime's ``Reflector`` does the list+watch (bookmarks, relist by diff on 410, backoff,
stalled watches reopened); this module feeds its changes to the ``Catalog`` and turns its
troubles into readiness and metrics. A failed list changes nothing; ``/readyz`` turns ready
after the first list that succeeds and stays ready while the apiserver is away, serving the
last good fleet.

One watch on all Nodes serves both the fleet (server Nodes) and the topology (client Nodes):
a relabel that turns a node into a server arrives as one event on one stream, instead of as
a race between two, and the apiserver keeps one connection per replica, not two.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from typing import Any, cast

import anyio
from anyio.abc import TaskStatus
from opentelemetry import trace

from rgpu_runtime import (
    Backoff,
    KubeClient,
    Listing,
    ObjectChange,
    Readiness,
    Reflector,
    ReflectorTiming,
    WatchEvent,
    WatchTrouble,
    kube_pages,
)

from .catalog import Catalog
from .instruments import Instruments

__all__ = ["NodeWatch"]

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


def _node(obj: dict[str, Any]) -> dict[str, Any]:
    return obj


class NodeWatch:
    """Keeps a ``Catalog`` in step with the apiserver's Nodes."""

    def __init__(
        self,
        *,
        kube: KubeClient,
        catalog: Catalog,
        readiness: Readiness,
        instruments: Instruments,
        backoff: Backoff,
    ) -> None:
        self._kube = kube
        self._catalog = catalog
        self._readiness = readiness
        self._instruments = instruments
        self.reflector = Reflector[dict[str, Any]](
            name="nodes",
            list_pages=self._pages,
            watch=self._watch,
            transform=_node,
            on_change=self._changed,
            on_relist=self._relisted,
            on_trouble=self._troubled,
            timing=ReflectorTiming(backoff=backoff),
        )

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the Nodes until cancelled; started at once, ready after the first list."""
        self._readiness.set_not_ready("waiting for the first Node list")
        task_status.started()
        async with anyio.create_task_group() as tg:
            await tg.start(self.reflector.run)
            logger.info("first Node list: %d nodes", len(self.reflector.values))
            self._readiness.set_ready()

    async def _pages(self) -> AsyncIterator[Listing]:
        # A plain span, not the current one: this generator yields to the reflector between
        # pages, and a context attached here must not leak into its code.
        with tracer.start_span("discovery.nodes.list") as span:
            count = 0
            async for page in kube_pages(self._kube, self._kube.core.list_node):
                count += len(page.items)
                yield page
            span.set_attribute("rgpu.nodes", count)

    async def _watch(self, version: str) -> AsyncIterator[WatchEvent]:
        with tracer.start_span("discovery.nodes.watch") as span:
            span.set_attribute("rgpu.resource_version", version)
            stream = self._kube.watch(self._kube.core.list_node, resource_version=version)
            # The runtime's watch is an async generator; closing it closes the connection.
            async with aclosing(cast(AsyncGenerator[WatchEvent, None], stream)) as events:
                async for event in events:
                    yield event

    def _changed(self, change: ObjectChange[dict[str, Any]]) -> None:
        obj = change.after if change.after is not None else change.before
        if obj is not None:
            self._catalog.observe(change.type, obj)

    def _relisted(
        self, changes: Sequence[ObjectChange[dict[str, Any]]], nodes: Mapping[str, dict[str, Any]]
    ) -> None:
        # The catalog swaps a whole list in and publishes once, not once per Node.
        self._catalog.relist(nodes.values())

    def _troubled(self, trouble: WatchTrouble) -> None:
        self._instruments.watch_restarts.labels(trouble.reason).inc()
        error = trouble.error
        if error is None or trouble.reason == "expired":
            return
        self._instruments.apiserver_errors.labels(trouble.phase, error.code).inc()
        if not self._readiness.ready:
            self._readiness.set_not_ready(f"Node list failed: {error.message}")
