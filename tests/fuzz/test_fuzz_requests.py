"""Every route of the four services, fed hostile query strings, path parameters and headers.

The long-polls read ``since`` and ``wait`` (thousands of digits, ``NaN``, infinities, negative
and fractional values, repeated keys); path parameters (pod uids, server names) arrive huge,
empty, percent-encoded or non-ASCII; health, readiness and ``/metrics`` get any ``Accept`` or
``traceparent``; every route gets the methods it does not serve. The stack's judge holds the
properties: below 500, within the bound, the service ready after.
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.anyio

FUZZ = settings.get_profile("rgpu-fuzz")
FEW = settings(FUZZ, max_examples=max(5, FUZZ.max_examples // 8))
"""For the commit route: a commit of a uid without a claim waits half a second for the Lease
watch (another replica may have just booked it) before it answers 404."""
SERVICES = ("discovery", "allocator", "extender", "metrics")
LONG_POLLS = (
    ("discovery", "/v1/fleet"),
    ("discovery", "/v1/topology"),
    ("allocator", "/v1/claims"),
)
HEALTH = ("/healthz", "/readyz", "/metrics")
PATH_ROUTES = (
    ("allocator", "GET", "/v1/allocations/{uid}"),
    ("allocator", "DELETE", "/v1/allocations/{uid}"),
    ("discovery", "POST", "/v1/servers/{name}/probe"),
)
COMMIT = "/v1/allocations/{uid}/commit"
ROUTES = (
    *((service, route) for service in SERVICES for route in HEALTH),
    *LONG_POLLS,
    ("allocator", "/v1/status"),
    ("allocator", "/v1/allocations"),
    ("allocator", "/v1/allocations/some-uid"),
    ("allocator", "/v1/allocations/some-uid/commit"),
    ("discovery", "/v1/servers/gpu-node-2/probe"),
    ("extender", "/filter"),
    ("extender", "/prioritize"),
    ("extender", "/bind"),
    ("extender", "/mutate"),
    ("metrics", "/no/such/route"),
)
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE")
HELD_AT_MOST = 0.05
"""Seconds a drawn ``wait`` may hold a long-poll: longer valid waits are cut to this, since a
60-second wait that is honoured is the contract, not a hang."""
NUMBERS = (
    "",
    "0",
    "-1",
    "-0",
    "1.5",
    "1e3",
    "1_0",
    "0x10",
    " 1",
    "NaN",
    "nan",
    "inf",
    "-inf",
    "1e309",
    "9" * 19,
    "9" * 20,
    "9" * 5000,
    "\u0663",  # ARABIC-INDIC DIGIT THREE: str.isdigit() and float() accept it
    "\uff11\uff12",  # FULLWIDTH 12
)
HEADER_TEXT = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60
) | st.sampled_from(
    (
        "00-" + "0" * 32 + "-" + "0" * 16 + "-01",
        "ff-" + "f" * 32 + "-" + "f" * 16 + "-ff",
        "gzip;q=nan, *;q=1e999",
        "application/openmetrics-text; version=99.0.0; charset=nonsense",
        "x" * 8000,
    )
)


def _numbers() -> st.SearchStrategy[str]:
    return st.sampled_from(NUMBERS) | st.text(max_size=12) | st.integers().map(str)


def _query() -> st.SearchStrategy[list[tuple[str, str]]]:
    key = st.sampled_from(("since", "wait")) | st.text(max_size=8)
    return st.lists(st.tuples(key, _numbers()), max_size=4)


def _bounded(query: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``query`` with every usable ``wait`` cut to ``HELD_AT_MOST`` seconds, and a zero wait
    added to a lone ``since`` (it would otherwise hold for the 30-second default)."""
    bounded = [(k, _cut(v) if k == "wait" else v) for k, v in query]
    if any(k == "since" for k, _ in bounded) and not any(k == "wait" for k, _ in bounded):
        bounded.append(("wait", "0"))
    return bounded


def _cut(wait: str) -> str:
    try:
        seconds = float(wait)
    except ValueError:
        return wait
    return str(HELD_AT_MOST) if math.isfinite(seconds) and seconds > HELD_AT_MOST else wait


def _segments() -> st.SearchStrategy[str]:
    """Path parameters: any text, and the shapes that broke services elsewhere."""
    nasty = (
        "gpu-node-2",  # the seeded server: a real probe, or the rate limit's answer
        "x" * 60_000,
        "..",
        ".",
        "a/b",
        "%",
        "\x00",
        "\ud7ff",
        "é" * 300,
        " ",
        "-" * 64,
    )
    return st.sampled_from(nasty) | st.text(min_size=1, max_size=40)


@pytest.mark.parametrize(("service", "route"), LONG_POLLS)
@FUZZ
@given(query=_query(), encoding=HEADER_TEXT)
async def test_long_poll_never_fails_on_any_since_or_wait(
    stack: Any, service: str, route: str, query: list[tuple[str, str]], encoding: str
) -> None:
    await stack.call(
        service,
        "GET",
        route,
        params=_bounded(query),
        headers={"accept-encoding": encoding},
        hold=HELD_AT_MOST,
    )


@pytest.mark.parametrize(("service", "method", "route"), PATH_ROUTES)
@FUZZ
@given(segment=_segments())
async def test_path_parameter_never_fails_whatever_its_text(
    stack: Any, service: str, method: str, route: str, segment: str
) -> None:
    path = route.replace("{uid}", quote(segment, safe="")).replace(
        "{name}", quote(segment, safe="")
    )
    await stack.call(service, method, route, path=path)


@FEW
@given(segment=_segments())
async def test_commit_never_fails_whatever_the_uid(stack: Any, segment: str) -> None:
    path = COMMIT.replace("{uid}", quote(segment, safe=""))
    await stack.call("allocator", "POST", COMMIT, path=path, body=b'{"node": "gpu-node-1"}')


@pytest.mark.parametrize("route", HEALTH)
@pytest.mark.parametrize("service", SERVICES)
@FUZZ
@given(accept=HEADER_TEXT, traceparent=HEADER_TEXT, query=_query())
async def test_health_and_metrics_never_fail_on_any_header_or_query(
    stack: Any, service: str, route: str, accept: str, traceparent: str, query: Any
) -> None:
    headers = {"accept": accept, "traceparent": traceparent, "tracestate": traceparent}
    await stack.call(service, "GET", route, params=query, headers=headers)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("service", "route"), ROUTES)
async def test_every_route_answers_any_method_without_failing(
    stack: Any, service: str, route: str, method: str
) -> None:
    await stack.call(service, method, route, body=b"{}" if method != "GET" else None)


@pytest.mark.parametrize(
    "headers",
    [
        {"content-length": "99999999999999999999"},
        {"content-length": "9" * 5000},
        {"content-length": "-1"},
        {"content-length": "1e3"},
        {"content-length": "0"},
        {"content-type": "application/json; charset=utf-32"},
        {"content-encoding": "gzip"},
        {"traceparent": "00-" + "f" * 32 + "-" + "f" * 16 + "-01"},
        {"x-forwarded-for": "x" * 8000},
    ],
    ids=lambda headers: "-".join(f"{k}={v[:12]}({len(v)})" for k, v in headers.items()),
)
@pytest.mark.parametrize(
    ("service", "route"),
    [("extender", "/filter"), ("extender", "/mutate"), ("allocator", "/v1/allocations")],
)
async def test_json_endpoint_survives_lying_or_odd_headers(
    stack: Any, service: str, route: str, headers: dict[str, str]
) -> None:
    await stack.call(service, "POST", route, body=b'{"a": 1}', headers=headers)
