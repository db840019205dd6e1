"""Fault injection: error rates, added latency, cut watches and expired resourceVersions.

Clients of a real apiserver must survive 429s with Retry-After, 5xx bursts, slow responses,
dropped watches and 410 Expired. These faults are set per (verb, resource), changed while the
server runs (in process or through ``/_sim/faults``), and drawn from a seeded generator so a
failing test replays the same sequence of faults.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rgpu_kubesim.apiserver.storage import Storage
from rgpu_kubesim.errors import ApiError, FaultSpecError
from rgpu_kubesim.machinery import status as _status

_MESSAGES = {
    429: "Too many requests, please try again later.",
    500: "Internal error occurred: injected fault",
    503: "the server is currently unable to handle the request",
    504: (
        "the server was unable to return a response in the time allotted, "
        "but may still be processing the request"
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorRule:
    verb: str
    resource: str
    rate: float
    code: int
    retry_after: int | None
    skip: int = 0
    """Matching requests let through before the rule starts failing any: a test can fail
    the second of two calls (the apiserver shedding load half-way through a sequence)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "verb": self.verb,
            "resource": self.resource,
            "rate": self.rate,
            "code": self.code,
            "retryAfter": self.retry_after,
            "skip": self.skip,
        }

    def error(self) -> ApiError:
        details = {"retryAfterSeconds": self.retry_after} if self.retry_after else None
        message = _MESSAGES.get(self.code, f"injected fault (HTTP {self.code})")
        return _status.failure(self.code, message, details=details)


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencyRule:
    verb: str
    resource: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"verb": self.verb, "resource": self.resource, "seconds": self.seconds}


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultDecision:
    """What to do to one request: wait ``latency`` seconds, then fail with ``error`` if set."""

    latency: float = 0.0
    error: ApiError | None = None


def _candidates(verb: str, resource: str) -> tuple[tuple[str, str], ...]:
    """Rule keys that apply, most specific first; a plural also covers its subresources."""
    base = resource.partition("/")[0]
    resources = (resource, base, "*") if base != resource else (resource, "*")
    return tuple((v, r) for v in (verb, "*") for r in resources)


class Faults:
    """The fault settings of one simulated apiserver; safe to change while it serves."""

    def __init__(self, storage: Storage, *, seed: int = 0) -> None:
        self._storage = storage
        self._rng = random.Random(seed)
        self._errors: dict[tuple[str, str], ErrorRule] = {}
        self._skipped: dict[tuple[str, str], int] = {}
        self._latencies: dict[tuple[str, str], LatencyRule] = {}
        self._expired_before: int | None = None

    def set_error(
        self,
        *,
        verb: str = "*",
        resource: str = "*",
        rate: float,
        code: int = 500,
        retry_after: int | None = None,
        skip: int = 0,
    ) -> None:
        """Fail ``rate`` (0..1) of matching requests with HTTP ``code``, after letting the first
        ``skip`` through; rate 0 removes the rule."""
        if not 0.0 <= rate <= 1.0:
            raise FaultSpecError(f"rate must be between 0 and 1, got {rate!r}")
        if not 400 <= code <= 599:
            raise FaultSpecError(
                f"code must be an HTTP error code between 400 and 599, got {code!r}"
            )
        if retry_after is not None and retry_after < 0:
            raise FaultSpecError(
                f"retry_after must be a non-negative number of seconds, got {retry_after!r}"
            )
        if skip < 0:
            raise FaultSpecError(f"skip must be a non-negative number of requests, got {skip!r}")
        self._skipped.pop((verb, resource), None)
        if rate == 0.0:
            self._errors.pop((verb, resource), None)
            return
        rule = ErrorRule(
            verb=verb, resource=resource, rate=rate, code=code, retry_after=retry_after, skip=skip
        )
        self._errors[(verb, resource)] = rule

    def set_latency(self, *, verb: str = "*", resource: str = "*", seconds: float) -> None:
        """Delay matching requests by ``seconds`` (0 removes the rule)."""
        if seconds < 0:
            raise FaultSpecError(f"seconds must be non-negative, got {seconds!r}")
        if seconds == 0:
            self._latencies.pop((verb, resource), None)
            return
        self._latencies[(verb, resource)] = LatencyRule(
            verb=verb, resource=resource, seconds=seconds
        )

    def cut_watches(self) -> None:
        """Close every open watch stream now; clients see a clean end of stream."""
        self._storage.hub.cut_all()

    def expire_before(self, resource_version: int | None = None) -> None:
        """Watches (and continue tokens) from older versions get 410; None means 'now'."""
        floor = self._storage.resource_version if resource_version is None else resource_version
        self._expired_before = max(self._expired_before or 0, floor)
        self._storage.expire_before(floor)

    def clear(self) -> None:
        """Remove error and latency rules (expired versions stay expired, as after compaction)."""
        self._errors.clear()
        self._skipped.clear()
        self._latencies.clear()

    def decide(self, verb: str, resource: str) -> FaultDecision:
        """Draw this request's fate; one random draw per request that an error rule covers."""
        keys = _candidates(verb, resource)
        latency = next((self._latencies[k].seconds for k in keys if k in self._latencies), 0.0)
        key = next((k for k in keys if k in self._errors), None)
        if key is None or self._skips(key):
            return FaultDecision(latency=latency)
        rule = self._errors[key]
        if self._rng.random() < rule.rate:
            return FaultDecision(latency=latency, error=rule.error())
        return FaultDecision(latency=latency)

    def _skips(self, key: tuple[str, str]) -> bool:
        """Whether this request is one of those the rule at ``key`` lets through first."""
        seen = self._skipped.get(key, 0)
        self._skipped[key] = seen + 1
        return seen < self._errors[key].skip

    def to_dict(self) -> dict[str, Any]:
        return {
            "errors": [r.to_dict() for r in self._errors.values()],
            "latencies": [r.to_dict() for r in self._latencies.values()],
            "expiredBefore": self._expired_before,
            "openWatches": self._storage.hub.count(),
        }

    def apply(self, body: Mapping[str, Any], *, replace: bool) -> None:
        """Apply a ``/_sim/faults`` JSON body; PUT (``replace``) clears rules first."""
        if replace or body.get("clear"):
            self.clear()
        for index, spec in enumerate(_list_field(body, "errors")):
            self.set_error(**_error_kwargs(spec, f"errors[{index}]"))
        for index, spec in enumerate(_list_field(body, "latencies")):
            self.set_latency(**_latency_kwargs(spec, f"latencies[{index}]"))
        if "expireBefore" in body:
            self.expire_before(_optional_int(body["expireBefore"], "expireBefore"))
        if body.get("cutWatches"):
            self.cut_watches()


def _list_field(body: Mapping[str, Any], field: str) -> list[Mapping[str, Any]]:
    value = body.get(field) or []
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise FaultSpecError(f"{field} must be a list of objects")
    return value


def _error_kwargs(spec: Mapping[str, Any], path: str) -> dict[str, Any]:
    return {
        "verb": _text(spec, "verb", path),
        "resource": _text(spec, "resource", path),
        "rate": _number(spec.get("rate"), f"{path}.rate"),
        "code": int(_number(spec.get("code", 500), f"{path}.code")),
        "retry_after": _optional_int(spec.get("retryAfter"), f"{path}.retryAfter"),
        "skip": int(_number(spec.get("skip", 0), f"{path}.skip")),
    }


def _latency_kwargs(spec: Mapping[str, Any], path: str) -> dict[str, Any]:
    return {
        "verb": _text(spec, "verb", path),
        "resource": _text(spec, "resource", path),
        "seconds": _number(spec.get("seconds"), f"{path}.seconds"),
    }


def _text(spec: Mapping[str, Any], field: str, path: str) -> str:
    value = spec.get(field, "*")
    if not isinstance(value, str) or not value:
        raise FaultSpecError(f'{path}.{field} must be a verb/resource name or "*", got {value!r}')
    return value


def _number(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FaultSpecError(f"{path} must be a number, got {value!r}")
    return float(value)


def _optional_int(value: Any, path: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise FaultSpecError(f"{path} must be an integer or null, got {value!r}")
    return value
