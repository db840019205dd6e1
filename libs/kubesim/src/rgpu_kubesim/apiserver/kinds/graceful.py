"""Graceful deletion of pods, as kube-apiserver's pod strategy and generic store do it.

A pod running on a node is not removed by a DELETE: its containers still hold what they hold
(a remote GPU among them) until the kubelet has stopped them. The apiserver only marks it
(``deletionTimestamp``, ``deletionGracePeriodSeconds``) and the kubelet finishes the deletion
with a grace period of 0. Unbound and finished pods have nothing to stop and go at once. Code
that decides whether a server is free must see this window, so the simulator reproduces it.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from rgpu_kubesim.machinery import status as _status
from rgpu_kubesim.machinery import timestamp

JsonObj = dict[str, Any]
_DEFAULT_GRACE_SECONDS = 30
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def requested_grace(query: Mapping[str, str], body: Mapping[str, Any]) -> int | None:
    """``gracePeriodSeconds`` from the DeleteOptions body, else from the query; None if unset."""
    raw = body.get("gracePeriodSeconds")
    if raw is None:
        raw = query.get("gracePeriodSeconds") or None
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise _status.bad_request(f"gracePeriodSeconds: expected an integer, got {raw!r}")
    try:
        return int(raw)
    except ValueError as exc:
        raise _status.bad_request(
            f"gracePeriodSeconds: invalid value {raw!r}: must be an integer number of seconds"
        ) from exc


def _pod_grace(pod: Mapping[str, Any], requested: int | None) -> int:
    """kube's pod CheckGracefulDelete: the period a first DELETE gives the pod."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    period = requested
    if period is None:
        period = int(spec.get("terminationGracePeriodSeconds", _DEFAULT_GRACE_SECONDS))
    if not spec.get("nodeName") or status.get("phase") in _TERMINAL_PHASES:
        return 0
    return 1 if period < 0 else period


def terminating(pod: JsonObj, requested: int | None, now: float) -> JsonObj | None:
    """The pod as a DELETE leaves it, or None when it is to be removed now.

    A pod already terminating keeps its deadline unless ``requested`` is shorter: a second
    DELETE may shorten the grace period, never lengthen it.
    """
    meta = pod["metadata"]
    current = meta.get("deletionGracePeriodSeconds")
    if meta.get("deletionTimestamp"):
        if current is None or (requested is not None and requested <= 0):
            return None
        if requested is None or requested >= current:
            return pod
        started = _seconds(meta["deletionTimestamp"]) - current
        meta["deletionTimestamp"] = timestamp(started + requested)
        meta["deletionGracePeriodSeconds"] = requested
        return pod
    period = _pod_grace(pod, requested)
    if period == 0:
        return None
    meta["deletionTimestamp"] = timestamp(now + period)
    meta["deletionGracePeriodSeconds"] = period
    meta["generation"] = int(meta.get("generation") or 1) + 1
    return pod


def _seconds(stamp: str) -> float:
    moment = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    return moment.timestamp()
