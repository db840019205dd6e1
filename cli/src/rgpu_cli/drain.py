"""``rgpu drain <server>`` empties a server for maintenance, as ``kubectl drain`` empties a
Node — but the pods to move are not on the server Node (lupine's clients run elsewhere): they
are the server's holders, named by the claims on its Lease.

1. The server is cordoned first (``cordon``), so nothing new lands while it drains.
2. Every holder is evicted through the Eviction API, so PodDisruptionBudgets decide: a ``429``
   (the budget forbids it now) is retried with backoff until the timeout, and said so.
3. The drain waits until every holder is gone (deleted, or finished), printing each step.

The exit code says whether it finished: 0 drained, 1 holders left at the timeout (named), 2 it
could not start. A Node name drains all its lupine instances; ``<node>@<port>`` one instance.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import anyio

from rgpu_contracts import INSTANCE_SEPARATOR, Claim, ContractError, PodRef
from rgpu_runtime.errors import KubeError
from rgpu_runtime.pacing import Backoff
from rgpu_runtime.settings import Settings

from .cordon import cordon
from .kube import cli_kube_client

if TYPE_CHECKING:
    from rgpu_runtime.kube import KubeClient

__all__ = ["CLAIM_LEASES", "DrainReport", "drain", "holders_in"]

CLAIM_LEASES: Final = "app.kubernetes.io/managed-by=rgpu"
ANNOTATION_CLAIMS: Final = "rgpu.io/claims"
ANNOTATION_SERVER: Final = "rgpu.io/server"
RETRY: Final = Backoff(initial=1.0, maximum=15.0, jitter=0.2)
"""Between evictions a budget refused: soon at first (a replica may just have become Ready),
then every 15 s at most, as kubectl drain retries every 5 s."""
POLL_SECONDS: Final = 0.5
_FINISHED: Final = ("Succeeded", "Failed")

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainReport:
    """How the drain ended: the holders found, and those still there at the end."""

    server: str
    holders: tuple[PodRef, ...]
    left: tuple[PodRef, ...]

    @property
    def finished(self) -> bool:
        return not self.left


def _covers(server: str, named: str) -> bool:
    """Whether draining ``server`` drains the claims of server ``named``."""
    if INSTANCE_SEPARATOR in server:
        return named == server
    return named == server or named.startswith(f"{server}{INSTANCE_SEPARATOR}")


def holders_in(leases: Iterable[Mapping[str, Any]], server: str) -> tuple[PodRef, ...]:
    """The pods claiming ``server`` (or, for a Node name, any of its instances) in claim
    Leases as the apiserver lists them; unreadable claims are skipped."""
    found: dict[str, PodRef] = {}
    for lease in leases:
        annotations = (lease.get("metadata") or {}).get("annotations") or {}
        if not _covers(server, str(annotations.get(ANNOTATION_SERVER, ""))):
            continue
        for claim in _claims(annotations.get(ANNOTATION_CLAIMS)):
            found.setdefault(claim.pod.uid, claim.pod)
    return tuple(sorted(found.values(), key=lambda p: p.key))


def _claims(text: object) -> list[Claim]:
    try:
        raw = json.loads(text) if isinstance(text, str) else []
        return [Claim.from_dict(item) for item in raw]
    except (ValueError, ContractError, TypeError):
        return []


async def drain(settings: Settings, server: str, *, timeout: float, say: Say) -> DrainReport:
    """Cordon ``server``, evict its holders and wait until they are gone or ``timeout``
    seconds pass; raises ``CordonError`` or ``KubeError`` when it cannot start."""
    done = await cordon(settings, server)
    say(done.describe(server, on=True))
    async with cli_kube_client(settings) as kube:
        listing = await kube.call_raw(
            kube.coordination.list_namespaced_lease,
            settings.scheduling.namespace,
            label_selector=CLAIM_LEASES,
        )
        holders = holders_in(listing.get("items") or [], server)
        say(f"{len(holders)} holder(s): {', '.join(p.key for p in holders) or 'none'}")
        left = await _empty(kube, holders, time.monotonic() + timeout, say)
    return DrainReport(server=server, holders=holders, left=left)


async def _empty(
    kube: KubeClient, holders: tuple[PodRef, ...], deadline: float, say: Say
) -> tuple[PodRef, ...]:
    pending = {pod.uid: pod for pod in holders}
    # Pods whose eviction was refused: the attempts so far and when to try again.
    asked: dict[str, tuple[int, float]] = {}
    evicted: set[str] = set()
    while pending and time.monotonic() < deadline:
        for uid, pod in list(pending.items()):
            if await _gone(kube, pod):
                del pending[uid]
                say(f"{pod.key} is gone ({len(holders) - len(pending)}/{len(holders)})")
            elif _due(uid, evicted, asked) and await _evict(kube, pod, asked, say):
                evicted.add(uid)
        if pending:
            await anyio.sleep(POLL_SECONDS)
    return tuple(pending.values())


def _due(uid: str, evicted: set[str], asked: dict[str, tuple[int, float]]) -> bool:
    return uid not in evicted and time.monotonic() >= asked.get(uid, (0, 0.0))[1]


async def _evict(
    kube: KubeClient, pod: PodRef, asked: dict[str, tuple[int, float]], say: Say
) -> bool:
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
    }
    try:
        await kube.call_raw(kube.core.create_namespaced_pod_eviction, pod.name, pod.namespace, body)
    except KubeError as exc:
        if exc.kube_status == 404:
            return True
        attempt = asked.get(pod.uid, (-1, 0.0))[0] + 1
        delay = RETRY.delay(attempt)
        asked[pod.uid] = (attempt, time.monotonic() + delay)
        why = "a disruption budget forbids it now" if exc.kube_status == 429 else exc.message
        say(f"cannot evict {pod.key} yet: {why}; retrying in {delay:.0f}s")
        return False
    say(f"evicting {pod.key}")
    return True


async def _gone(kube: KubeClient, pod: PodRef) -> bool:
    try:
        got = await kube.call_raw(kube.core.read_namespaced_pod, pod.name, pod.namespace)
    except KubeError as exc:
        if exc.kube_status == 404:
            return True
        raise
    meta, status = got.get("metadata") or {}, got.get("status") or {}
    return meta.get("uid") != pod.uid or status.get("phase") in _FINISHED
