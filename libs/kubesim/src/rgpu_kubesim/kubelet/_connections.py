"""What a started pod's processes connect to, and how hard they try.

A GPU container's lupine client connects to its ``LUPINE_SERVER`` from the pod's address once
the pod runs. A pod learns its address when its sandbox is made, and the rest of the cluster
(rgpu's server policies included) only once the kubelet reports it; so its first attempts may
be refused while a policy admitting it is being written, and the client retries for a bounded
time, as a CUDA application's start-up retry would. Nothing listening is final at once.

Any pod may also carry ``sim.rgpu.io/dial``: endpoints its program connects to on its own (a
hard-coded address, an endpoint copied from another pod), each tried once at start, the
outcome kept in the pod's run record. It is how tests play a tenant that did not ask for a
server and goes to one anyway.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Final

import anyio

from rgpu_contracts import ContractError
from rgpu_contracts.hami import split_endpoint
from rgpu_kubesim.kubelet._config import KubeletConfig, LupineClientSink, RunRecord
from rgpu_kubesim.lupine import Dialed, dial

__all__ = ["DIAL_ANNOTATION", "Attachment", "attach", "dial_all", "dial_targets", "reach"]

DIAL_ANNOTATION: Final = "sim.rgpu.io/dial"
"""Comma-separated ``host:port`` endpoints the pod's program connects to at start."""
_MAX_TARGETS: Final = 16
_FIRST_PAUSE: Final = 0.05
_LONGEST_PAUSE: Final = 1.0
_WHY: Final = {
    Dialed.RESET: "the connection was reset (a NetworkPolicy may not admit this pod)",
    Dialed.TIMEOUT: "no answer",
    Dialed.REFUSED: "nothing answers",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Attachment:
    """What a GPU pod's lupine client will hold on its server once connected."""

    server: LupineClientSink
    gpus: tuple[str, ...]
    memory_bytes: int
    hostname: str


async def attach(record: RunRecord, attachment: Attachment, config: KubeletConfig) -> RunRecord:
    """Connect ``record``'s pod to its lupine from its address and, once connected, become the
    server's client; the record as it stands after (``Failed`` with why, when it could not)."""
    outcome = await reach(record.endpoint, record.address, config)
    if outcome is not Dialed.CONNECTED:
        why = (
            f"cannot connect to lupine at {record.endpoint} from {record.address}: {_WHY[outcome]}"
        )
        return replace(record, phase="Failed", message=why, finished_at=time.monotonic())
    attachment.server.add_client(
        record.uid,
        attachment.gpus,
        memory_bytes=attachment.memory_bytes,
        address=record.address,
        hostname=attachment.hostname,
    )
    return replace(record, gpus=attachment.gpus)


async def dial_all(
    annotations: Mapping[str, str], source: str, config: KubeletConfig
) -> Mapping[str, str]:
    """Try each ``sim.rgpu.io/dial`` endpoint once from ``source``; endpoint -> outcome."""
    outcomes = {}
    for endpoint in dial_targets(annotations):
        timeout = config.lupine_dial_timeout_seconds
        outcomes[endpoint] = (await dial(endpoint, source, timeout=timeout)).value
    return MappingProxyType(outcomes)


async def reach(endpoint: str, source: str, config: KubeletConfig) -> Dialed:
    """Connect until connected, refused outright, or ``lupine_connect_seconds`` are spent."""
    deadline = anyio.current_time() + config.lupine_connect_seconds
    pause = _FIRST_PAUSE
    while True:
        outcome = await dial(endpoint, source, timeout=config.lupine_dial_timeout_seconds)
        left = deadline - anyio.current_time()
        if outcome is Dialed.CONNECTED or not outcome.retry or left <= 0:
            return outcome
        await anyio.sleep(min(pause, left))
        pause = min(pause * 2, _LONGEST_PAUSE)


def dial_targets(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """The well-formed endpoints of ``sim.rgpu.io/dial`` (at most 16; others are ignored)."""
    raw = annotations.get(DIAL_ANNOTATION, "")
    found = []
    for item in (t.strip() for t in raw.split(",")):
        try:
            split_endpoint(item)
        except ContractError:
            continue
        found.append(item)
    return tuple(dict.fromkeys(found))[:_MAX_TARGETS]
