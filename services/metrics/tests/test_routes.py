"""GET /metrics: scrape assembly (registry and card block in one body, in the negotiated
format), and parts sent as consecutive body messages under one exact Content-Length."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import Message

from rgpu_metrics.board import Board
from rgpu_metrics.routes import PartsResponse, expose

pytestmark = pytest.mark.anyio


def setup(make) -> tuple[CollectorRegistry, Board]:
    registry = CollectorRegistry()
    Gauge("own_gauge", "An own metric.", registry=registry).set(3)
    board = Board()
    board.set_fleet(make.fleet(make.server("gpu-a", cards=2)))
    return registry, board


def test_without_accept_the_text_format_carries_own_and_card_families(make):
    exposition = expose(*setup(make), "")
    assert exposition.content_type.startswith("text/plain; version=0.0.4")
    names = {f.name for f in text_string_to_metric_families(exposition.body.decode())}
    assert {"own_gauge", "hami_remote_gpu_allocated", "rgpu_server_up"} <= names


def test_openmetrics_ends_with_a_single_eof_after_the_card_families(make):
    accept = "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
    exposition = expose(*setup(make), accept)
    body = exposition.body.decode()
    assert exposition.content_type.startswith("application/openmetrics-text; version=1.0.0")
    last = 'rgpu_server_cordoned{server="gpu-a",endpoint="10.0.0.1:14833"} 0'
    assert body.endswith(f"{last}\n# EOF\n")
    assert body.count("# EOF") == 1
    names = {f.name for f in openmetrics_families(body)}
    assert {"own_gauge", "hami_remote_gpu_overview", "rgpu_card_holder"} <= names


def test_parts_join_to_the_body(make):
    exposition = expose(*setup(make), "")
    assert b"".join(exposition.parts) == exposition.body
    assert len(exposition.parts) > 2


async def send_all(response: PartsResponse) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await response({"type": "http", "method": "GET"}, receive, send)
    return sent


async def test_parts_are_sent_in_order_and_only_the_last_ends_the_body():
    sent = await send_all(PartsResponse([b"ab", b"", b"cde"], content_type="text/plain"))
    start, *bodies = sent
    assert dict(start["headers"])[b"content-length"] == b"5"
    assert [(m["body"], m["more_body"]) for m in bodies] == [(b"ab", True), (b"cde", False)]


async def test_no_parts_still_end_the_response_with_an_empty_body():
    start, body = await send_all(PartsResponse([], content_type="text/plain"))
    assert dict(start["headers"])[b"content-length"] == b"0"
    assert body == {"type": "http.response.body", "body": b""}
