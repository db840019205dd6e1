"""Which remote GPUs a pod's containers use, decided the way the container runtime would.

A container naming the remote-GPU resource connects to the lupine server its resolved
``LUPINE_SERVER`` names, restricted to ``CUDA_VISIBLE_DEVICES`` when set, holding its
per-card memory request. Anything that would make the real process fail at start (no
endpoint, two endpoints, a GPU the server lacks) is a `StartFailure` the kubelet reports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from rgpu_kubesim.lupine import LupineGpu
from rgpu_kubesim.machinery import parse_quantity

_DEFAULT_MEMORY_BYTES: Final = 1 << 30
_MIB: Final = 1 << 20


class StartFailure(Exception):
    """The containers cannot run as asked (no endpoint, server unreachable, unknown GPU)."""


def containers_asking(pod: Mapping[str, Any], resource: str) -> list[Mapping[str, Any]]:
    """The containers (init containers first) that ask for ``resource``."""
    spec = pod.get("spec", {})
    found = []
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        resources = container.get("resources") or {}
        if resource in (resources.get("limits") or {}) or resource in (
            resources.get("requests") or {}
        ):
            found.append(container)
    return found


def endpoint_of(env: Mapping[str, Mapping[str, str]], names: list[str], variable: str) -> str:
    """The one server every requesting container names; raises ``StartFailure`` otherwise."""
    values = {name: env.get(name, {}).get(variable, "") for name in names}
    empty = [name for name, value in values.items() if not value]
    if empty:
        raise StartFailure(f"{variable} resolved empty in container(s) {', '.join(empty)}")
    distinct = sorted(set(values.values()))
    if len(distinct) > 1:
        raise StartFailure(f"{variable} names different servers in one pod: {distinct}")
    return distinct[0]


def _visible(gpus: Sequence[LupineGpu], visible: str, variable: str) -> list[str]:
    by_token = {g.uuid: g.uuid for g in gpus} | {str(g.index): g.uuid for g in gpus}
    tokens = [t.strip() for t in visible.split(",") if t.strip()]
    unknown = [t for t in tokens if t not in by_token]
    if unknown:
        raise StartFailure(f"{variable}={visible} names GPUs the server does not have: {unknown}")
    return [by_token[t] for t in tokens]


def devices(
    gpus: Sequence[LupineGpu], env: Mapping[str, Mapping[str, str]], names: list[str], variable: str
) -> list[str]:
    """GPU UUIDs the named containers use: their ``variable`` list, else every GPU."""
    chosen: list[str] = []
    for name in names:
        visible = env.get(name, {}).get(variable, "")
        uuids = _visible(gpus, visible, variable) if visible else [g.uuid for g in gpus]
        chosen.extend(u for u in uuids if u not in chosen)
    return chosen


def memory_bytes(containers: list[Mapping[str, Any]], resource: str) -> int:
    """Bytes held per GPU: the largest MiB request among ``containers`` (1 GiB if none)."""
    amounts = []
    for container in containers:
        resources = container.get("resources") or {}
        raw = (resources.get("limits") or {}).get(resource) or (
            resources.get("requests") or {}
        ).get(resource)
        try:
            amounts.append(int(parse_quantity(raw)) * _MIB if raw is not None else 0)
        except ValueError:
            continue
    return max(amounts, default=0) or _DEFAULT_MEMORY_BYTES
