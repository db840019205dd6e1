"""An AdmissionReview is refused by its shape before it is decoded, and before any work per
container: one review of a pod with 1.5 million containers (4.6 MiB) cost 6.8 s of CPU, and
eight at once held the webhook for nearly a minute. The body's size is already bounded while it
streams in (``WEBHOOK_MAX_BODY_BYTES``: what the apiserver can send); here its count of JSON
values is bounded before ``orjson`` builds them, and its containers right after, so the most
expensive review the webhook accepts costs a bounded, measured amount of CPU
(``bench/bench_admission.py``: under 100 ms).

No pod the webhook is meant for comes near either bound: a GPU pod has a few hundred to a few
thousand JSON values and a handful of containers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_POD_CONTAINERS",
    "MAX_REVIEW_VALUES",
    "count_values",
    "leading_uid",
    "too_many_containers",
    "too_many_values",
]

MAX_REVIEW_VALUES = 1 << 15
"""The most JSON values (32,768) a review may hold, object and oldObject together, counted as
the bytes that separate or open them (``,`` ``{`` ``[``) before decoding: ten times a large
honest pod's, and small enough that deciding the largest accepted review costs well under
100 ms of CPU (``bench/bench_admission.py``)."""
MAX_POD_CONTAINERS = 256
"""The most containers one pod object may list, containers, initContainers and
ephemeralContainers together. Kubernetes sets no count of its own; a pod with hundreds of
containers is already far outside what rgpu schedules, and this keeps the work per container
(type checks, demand, patches) bounded."""

_SECTIONS = ("containers", "initContainers", "ephemeralContainers")
_REQUEST_UID = re.compile(rb'"request"\s*:\s*\{\s*"uid"\s*:\s*"([A-Za-z0-9][-A-Za-z0-9_.]{0,127})"')
"""The apiserver writes ``request.uid`` first (Go field order), within the first bytes."""
_UID_WINDOW = 4096


def count_values(body: bytes) -> int:
    """An upper bound on the JSON values in ``body``: each but the first in an array or object
    follows a comma, and each array or object opens with a bracket. Separators inside strings
    are counted too, which only overstates."""
    return body.count(b",") + body.count(b"{") + body.count(b"[")


def too_many_values(body: bytes, values: int | None = None) -> str | None:
    """Why ``body`` is refused before decoding, or None (``values``: its count, if known)."""
    values = count_values(body) if values is None else values
    if values <= MAX_REVIEW_VALUES:
        return None
    return (
        f"the AdmissionReview holds about {values} JSON values, more than the "
        f"{MAX_REVIEW_VALUES} the webhook decodes; no pod rgpu schedules is that large: "
        "remove containers, env entries, volumes or annotations from the pod"
    )


def too_many_containers(pod: Mapping[str, Any] | None) -> str | None:
    """Why a pod object is refused before any of its containers is read, or None."""
    spec = pod.get("spec") if pod is not None else None
    if not isinstance(spec, Mapping):
        return None
    count = sum(_length(spec.get(section)) for section in _SECTIONS)
    if count <= MAX_POD_CONTAINERS:
        return None
    return (
        f"lists {count} containers (containers, initContainers and ephemeralContainers "
        f"together), more than the {MAX_POD_CONTAINERS} the webhook accepts; split the work "
        "over several pods"
    )


def leading_uid(body: bytes) -> str | None:
    """The review's ``request.uid`` read from its first bytes, as the apiserver orders them, so
    a review refused before decoding can still be answered with a denial that names why."""
    found = _REQUEST_UID.search(body, 0, _UID_WINDOW)
    return found.group(1).decode("ascii") if found else None


def _length(value: object) -> int:
    return len(value) if isinstance(value, list) else 0
