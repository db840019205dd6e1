"""Every call the extender makes to a peer, in one place, so each verb sees values and our
own errors only and replies inside kube-scheduler's timeout, never with a traceback.

The allocator's API answers in several contracts by status (an ``Allocation``, a ``NoFit`` on
409, an ``ErrorBody`` otherwise); ``AllocatorClient`` turns every one of them, and every
transport failure, into a value or one of our errors. The extender makes two apiserver calls of
its own — bind a pod, read it back when a bind's outcome is unknown — and ``Apiserver`` bounds
each in time and fails with runtime's ``KubeError`` family, never a kubernetes_asyncio
exception. (Discovery is followed by ``rgpu_runtime.feeds.DiscoveryMirror``; Events go through the
runtime's ``EventRecorder``.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import orjson

from rgpu_contracts import (
    Allocation,
    AllocationRequest,
    CommitRequest,
    ContractError,
    NodeName,
    NoFit,
)
from rgpu_runtime.errors import Unavailable
from rgpu_runtime.kube import KubeClient
from rgpu_runtime.peers import response_error, upstream_error

from .errors import AllocatorUnavailable, ClaimNotHeld, PeerReplyInvalid

__all__ = ["AllocatorClient", "Apiserver"]

T = TypeVar("T")

_CALL_ERRORS = (httpx.HTTPError, OSError, TimeoutError)


class AllocatorClient:
    """Calls to the allocator over one pooled ``httpx.AsyncClient`` (owned by the lifespan)."""

    __slots__ = ("_http",)

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def allocate(self, request: AllocationRequest) -> Allocation | NoFit:
        """Book a server for the pod; a ``NoFit`` says why none fits.

        Raises ``AllocatorUnavailable`` (unreachable, timeout, 5xx) or ``PeerReplyInvalid``.
        """
        response = await self._send("POST", "/v1/allocations", request.to_dict())
        if response.status_code == 200:
            return _decode(response, Allocation.from_dict)
        if response.status_code == 409:
            return _decode(response, NoFit.from_dict)
        raise _failure(response)

    async def commit(self, uid: str, node: str) -> Allocation:
        """Commit the pod's claim for ``node``; the answer carries the Binding's annotations.

        Raises ``ClaimNotHeld`` (404/409: the uid holds no claim), ``AllocatorUnavailable`` or
        ``PeerReplyInvalid``.
        """
        response = await self._send(
            "POST", f"{_path(uid)}/commit", CommitRequest(node=NodeName(node)).to_dict()
        )
        if response.status_code == 200:
            return _decode(response, Allocation.from_dict)
        if response.status_code in (404, 409):
            error = response_error(response, peer=_peer(response))
            raise ClaimNotHeld(
                f"pod uid {uid} holds no claim to commit: {error.message}",
                absent=response.status_code == 404,
            )
        raise _failure(response)

    async def release(self, uid: str) -> None:
        """Release the pod's claim; releasing a claim that is already gone succeeds."""
        response = await self._send("DELETE", _path(uid))
        if response.status_code not in (200, 204, 404):
            raise _failure(response)

    async def find(self, uid: str) -> Allocation | None:
        """The pod's current allocation, or ``None`` when it holds no claim."""
        response = await self._send("GET", _path(uid))
        if response.status_code == 200:
            return _decode(response, Allocation.from_dict)
        if response.status_code == 404:
            return None
        raise _failure(response)

    async def _send(self, method: str, url: str, body: object = None) -> httpx.Response:
        content = None if body is None else orjson.dumps(body)
        headers = {"content-type": "application/json"} if content is not None else None
        try:
            return await self._http.request(method, url, content=content, headers=headers)
        except _CALL_ERRORS as exc:
            error = upstream_error(exc, peer=str(self._http.base_url.join(url)))
            raise AllocatorUnavailable(f"allocator: {error.message}") from exc
        except Unavailable as exc:
            # The token source failed before anything was sent: kube-scheduler must still get
            # its verb's Error (and retry), not a 503 from the edge.
            raise AllocatorUnavailable(f"allocator: cannot authenticate: {exc.message}") from exc


class Apiserver:
    """The extender's view of the Kubernetes API, over runtime's ``KubeClient``."""

    __slots__ = ("_kube",)

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube

    async def bind(
        self, namespace: str, name: str, *, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        """POST the pod's Binding with ``annotations``; raises ``KubeConflict`` when bound."""
        await self._kube.bind_pod(namespace, name, uid=uid, node=node, annotations=annotations)

    async def read_pod(self, namespace: str, name: str, *, timeout: float) -> dict[str, Any]:
        """The pod as JSON; raises ``KubeNotFound`` when it is gone."""
        core = self._kube.core
        return await self._kube.call_raw(
            core.read_namespaced_pod, name, namespace, request_timeout=timeout
        )


def _path(uid: str) -> str:
    return f"/v1/allocations/{quote(uid, safe='')}"


def _peer(response: httpx.Response) -> str:
    return str(response.request.url.copy_with(query=None))


def _failure(response: httpx.Response) -> AllocatorUnavailable | PeerReplyInvalid:
    error = response_error(response, peer=_peer(response))
    if isinstance(error, Unavailable):
        return AllocatorUnavailable(f"allocator: {error.message}", retry_after=error.retry_after)
    if response.status_code >= 500:
        return AllocatorUnavailable(f"allocator: {error.message}")
    return PeerReplyInvalid(
        f"allocator: {error.message}", peer_status=response.status_code, peer_body=error.peer_body
    )


def _decode(response: httpx.Response, decode: Callable[[Mapping[str, object]], T]) -> T:
    try:
        raw = orjson.loads(response.content)
        if not isinstance(raw, dict):
            raise ContractError("", "expected a JSON object")
        return decode(raw)
    except (orjson.JSONDecodeError, ContractError) as exc:
        raise PeerReplyInvalid(
            f"allocator answered {response.status_code} with a body outside its contract "
            f"({_peer(response)}): {exc}",
            peer_status=response.status_code,
        ) from exc
