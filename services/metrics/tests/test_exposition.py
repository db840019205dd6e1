"""Scrape assembly: registry and card block in one body, in the negotiated format."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from rgpu_metrics.board import Board
from rgpu_metrics.exposition import expose


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
    assert body.endswith('rgpu_server_cards{server="gpu-a"} 2\n# EOF\n')
    assert body.count("# EOF") == 1
    names = {f.name for f in openmetrics_families(body)}
    assert {"own_gauge", "hami_remote_gpu_overview", "rgpu_card_holder"} <= names


def test_parts_join_to_the_body(make):
    exposition = expose(*setup(make), "")
    assert b"".join(exposition.parts) == exposition.body
    assert len(exposition.parts) > 2
