"""Per-server exposition lines: valid in both formats, escaped, each card id once."""

from __future__ import annotations

import logging
from dataclasses import replace

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from rgpu_contracts import PodRef, PodUID
from rgpu_metrics.rendering import FAMILIES, assemble, render_server


def text_of(lines, *, openmetrics=False) -> str:
    body = b"".join(assemble(lines).parts(openmetrics=openmetrics)).decode()
    return body + ("# EOF\n" if openmetrics else "")


def test_lines_parse_in_both_formats_with_one_family_each(make):
    lines = [render_server(make.server("gpu-a"), [make.claim("gpu-a", [0])])]
    text = {f.name for f in text_string_to_metric_families(text_of(lines))}
    om = {f.name: f.type for f in openmetrics_families(text_of(lines, openmetrics=True))}
    assert text == {family.name for family in FAMILIES}
    assert om["rgpu_card_holder"] == "info"
    assert len(om) == len(FAMILIES)


def test_every_family_has_a_header_even_without_samples(make):
    lines = [render_server(make.server("gpu-a"), [])]
    families = {f.name: f for f in text_string_to_metric_families(text_of(lines))}
    assert families["rgpu_card_holder_info"].samples == []
    assert families["rgpu_card_holder_info"].documentation


def test_label_values_with_quotes_backslashes_and_newlines_are_escaped(make):
    claim = make.claim("gpu-a", [0])
    odd = replace(claim, pod=PodRef(uid=PodUID("u"), namespace='a"b', name="c\\d\ne"))
    lines = [render_server(make.server("gpu-a", cards=1), [odd])]
    (family,) = [
        f
        for f in text_string_to_metric_families(text_of(lines))
        if f.name.startswith("rgpu_card_h")
    ]
    assert family.samples[0].labels["namespace"] == 'a"b'
    assert family.samples[0].labels["pod"] == "c\\d\ne"


def test_a_server_without_endpoint_exports_an_empty_endpoint_label(make):
    lines = [render_server(make.server("gpu-a", cards=1, endpoint=None), [])]
    families = {f.name: f for f in text_string_to_metric_families(text_of(lines))}
    assert families["rgpu_server_up"].samples[0].labels["endpoint"] == ""


def test_duplicate_and_foreign_card_ids_are_skipped_with_a_warning(make, caplog):
    server = make.server("gpu-a", cards=2)
    foreign = make.card("gpu-b", 0)
    odd = replace(server, cards=(*server.cards, server.cards[0], foreign))
    with caplog.at_level(logging.WARNING, logger="rgpu_metrics.rendering"):
        lines = [render_server(odd, [])]
    families = {f.name: f for f in text_string_to_metric_families(text_of(lines))}
    ids = [s.labels["device_uuid"] for s in families["hami_remote_gpu_allocated"].samples]
    assert ids == ["gpu-a/GPU-gpu-a-0", "gpu-a/GPU-gpu-a-1"]
    assert families["rgpu_server_cards"].samples[0].value == 2
    assert len(caplog.records) == 2


def test_memory_is_exported_in_bytes_and_the_limit_label_in_mib(make):
    server = make.server("gpu-a", cards=1)
    lines = [render_server(server, [make.claim("gpu-a", [0])])]
    families = {f.name: f for f in text_string_to_metric_families(text_of(lines))}
    (limit,) = families["hami_remote_gpu_memory_limit_bytes"].samples
    (overview,) = families["hami_remote_gpu_overview"].samples
    assert limit.value == 40960 * 1048576
    assert overview.value == 40960 * 1048576
    assert overview.labels["device_memory_limit"] == "40960"


def test_block_size_counts_sample_bytes(make):
    block = assemble([render_server(make.server("gpu-a"), [])])
    assert block.size == sum(len(s) for s in block.samples) > 0


def test_cordoned_servers_and_cards_are_exported(make):
    plain = make.server("gpu-a", cards=2)
    cards = (replace(plain.cards[0], cordoned=True), plain.cards[1])
    lines = [
        render_server(replace(plain, cards=cards), []),
        render_server(replace(make.server("gpu-b", cards=1), cordoned=True), []),
    ]
    families = {f.name: f for f in text_string_to_metric_families(text_of(lines))}
    card = {s.labels["card"]: s.value for s in families["rgpu_card_cordoned"].samples}
    server = {s.labels["server"]: s.value for s in families["rgpu_server_cordoned"].samples}
    assert card == {"gpu-a/GPU-gpu-a-0": 1, "gpu-a/GPU-gpu-a-1": 0, "gpu-b/GPU-gpu-b-0": 1}
    assert server == {"gpu-a": 0, "gpu-b": 1}


def test_card_states_carry_the_server_s_cuda_version(make):
    lines = [
        render_server(replace(make.server("gpu-a", cards=1), cuda_version="12.4"), []),
        render_server(make.server("gpu-b", cards=1), []),
    ]
    families = {f.name: f for f in text_string_to_metric_families(text_of(lines))}
    versions = {
        (s.labels["server"], s.labels["cuda_version"]) for s in families["rgpu_card_state"].samples
    }
    assert versions == {("gpu-a", "12.4"), ("gpu-b", "")}
