from __future__ import annotations

from pathlib import Path

import pytest

from rgpu_discovery.usage import UnreadableUsage, busy_gpus


def test_sample_body_marks_only_gpus_with_client_memory_lines(shared_fixtures: Path) -> None:
    text = (shared_fixtures / "lupine" / "metrics-sample.txt").read_text()
    assert busy_gpus(text) == {"GPU-7f2c1a9e-0b1d-4e55-9a77-3c2d1e0f9a01"}


def test_zero_value_still_counts_as_busy() -> None:
    text = 'lupine_client_device_memory_used_bytes{client_id="c",device_uuid="GPU-1"} 0\n'
    assert busy_gpus(text) == {"GPU-1"}


def test_empty_body_means_nothing_busy() -> None:
    assert busy_gpus("") == frozenset()


def test_distinct_uuids_across_clients_and_escaped_labels() -> None:
    text = (
        'lupine_client_device_memory_used_bytes{client_id="a\\"b",device_uuid="GPU-1"} 5\n'
        'lupine_client_device_memory_used_bytes{device_uuid="GPU-1",client_id="c\\\\d"} 7\n'
        'lupine_client_device_memory_used_bytes{ device_uuid = "GPU-2" ,} 1\n'
    )
    assert busy_gpus(text) == {"GPU-1", "GPU-2"}


def test_metric_with_longer_name_is_not_usage() -> None:
    text = 'lupine_client_device_memory_used_bytes_total{device_uuid="GPU-1"} 1\n'
    assert busy_gpus(text) == frozenset()


@pytest.mark.parametrize(
    "line",
    [
        'lupine_client_device_memory_used_bytes{device_uuid="GPU-1"',
        'lupine_client_device_memory_used_bytes{client_id="c"} 3',
        "lupine_client_device_memory_used_bytes 3",
        "lupine_client_device_memory_used_bytes{device_uuid=GPU-1} 3",
    ],
)
def test_unreadable_usage_sample_raises_naming_the_line(line: str) -> None:
    with pytest.raises(UnreadableUsage, match="line 2"):
        busy_gpus("# HELP x\n" + line + "\n")
