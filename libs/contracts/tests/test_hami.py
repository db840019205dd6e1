from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from rgpu_contracts import (
    ContractError,
    DeviceEntry,
    card_id,
    decode_devices,
    decode_register,
    encode_devices,
    join_endpoint,
    port_from_label,
    split_card_id,
    split_endpoint,
)

Load = Callable[[str], object]


def _example(load_fixture: Load, key: str) -> str:
    examples = load_fixture("hami/node-register-examples.json")
    assert isinstance(examples, dict)
    value = examples[key]
    assert isinstance(value, str)
    return value


def test_four_remote_cards_decode_with_omitted_index_and_numa_as_zero(load_fixture: Load) -> None:
    cards = decode_register(_example(load_fixture, "four_remote_a100"))
    assert [c.index for c in cards] == [0, 1, 2, 3]
    assert [c.numa for c in cards] == [0, 0, 1, 1]
    assert all(c.healthy and c.count == 1 and c.memory_mib == 40960 for c in cards)
    assert cards[0].model == "NVIDIA-A100-SXM4-40GB"


def test_mixed_modes_keep_remote_only_and_absent_health_is_unhealthy(load_fixture: Load) -> None:
    cards = decode_register(_example(load_fixture, "mixed_modes_one_unhealthy"))
    assert [(c.uuid, c.index, c.healthy) for c in cards] == [
        ("GPU-aaa", 0, True),
        ("GPU-bbb", 1, False),
    ]


@pytest.mark.parametrize("key", ["not_json_legacy_codec", "garbage"])
def test_undecodable_register_annotations_raise_contract_error(
    load_fixture: Load, key: str
) -> None:
    with pytest.raises(ContractError, match="JSON"):
        decode_register(_example(load_fixture, key))


@pytest.mark.parametrize(
    "text",
    [
        "{}",
        "[1]",
        '[{"mode": "remote"}]',
        '[{"mode": "remote", "id": "GPU-1", "devmem": "40"}]',
        '[{"mode": "remote", "id": "GPU-1", "health": "true"}]',
        '[{"mode": "remote", "id": "GPU-1", "index": -1}]',
    ],
)
def test_wrong_shapes_in_register_annotation_raise(text: str) -> None:
    with pytest.raises(ContractError):
        decode_register(text)


def test_card_id_splits_on_first_slash() -> None:
    assert card_id("gpu-a", "GPU-1") == "gpu-a/GPU-1"
    assert split_card_id("gpu-a/GPU-1") == ("gpu-a", "GPU-1")
    for bad in ("gpu-a", "/GPU-1", "gpu-a/"):
        with pytest.raises(ContractError):
            split_card_id(bad)


@pytest.mark.parametrize(
    ("value", "port", "fell_back"),
    [
        ("", 14833, False),
        (None, 14833, True),
        ("24000", 24000, False),
        ("not-a-port", 14833, True),
        ("0", 14833, True),
        ("70000", 14833, True),
        ("65535", 65535, False),
        ("²", 14833, True),
        ("true", 14833, True),
    ],
)
def test_port_label_rule(value: str | None, port: int, fell_back: bool) -> None:
    rule = port_from_label(value)
    assert rule.port == port
    assert (rule.problem is not None) == fell_back


def test_endpoint_join_brackets_ipv6_and_splits_back() -> None:
    assert join_endpoint("10.0.0.5", 14833) == "10.0.0.5:14833"
    assert join_endpoint("fd00::5", 14833) == "[fd00::5]:14833"
    assert split_endpoint("[fd00::5]:14833") == ("fd00::5", 14833)
    assert split_endpoint("gpu-a.example:1") == ("gpu-a.example", 1)
    for bad in ("nohost", "h:0", "h:x", "[::1]14833", ":80"):
        with pytest.raises(ContractError):
            split_endpoint(bad)


def test_device_codec_matches_hami_text_exactly() -> None:
    one = DeviceEntry(card=card_id("gpu-a", "GPU-1"), memory_mib=40000, cores=100)
    two = DeviceEntry(card=card_id("gpu-a", "GPU-2"), memory_mib=40000, cores=100)
    text = encode_devices([[one, two]])
    assert text == "gpu-a/GPU-1,RemoteGPU,40000,100:gpu-a/GPU-2,RemoteGPU,40000,100:;"
    assert decode_devices(text) == ((one, two),)


def test_container_without_cards_is_an_empty_part() -> None:
    one = DeviceEntry(card=card_id("s", "GPU-1"), memory_mib=1, cores=100)
    text = encode_devices([[], [one], []])
    assert text == ";s/GPU-1,RemoteGPU,1,100:;;"
    assert decode_devices(text) == ((), (one,), ())
    assert decode_devices("") == ()


@pytest.mark.parametrize(
    "text",
    [
        "s/GPU-1,RemoteGPU,1,100:",
        "s/GPU-1,RemoteGPU,1,100;",
        "s/GPU-1,RemoteGPU,1:;",
        "s/GPU-1,RemoteGPU,x,100:;",
        "GPU-1,RemoteGPU,1,100:;",
        "s/GPU-1,RemoteGPU,-1,100:;",
    ],
)
def test_malformed_device_parts_raise(text: str) -> None:
    with pytest.raises(ContractError):
        decode_devices(text)


def test_register_decodes_what_hami_writes_for_many_cards() -> None:
    entries = [
        {
            "id": f"GPU-{i}",
            "index": i,
            "count": 10,
            "devmem": 81920,
            "devcore": 100,
            "type": "H100",
            "mode": "remote",
            "health": True,
        }
        for i in range(8)
    ]
    cards = decode_register(json.dumps(entries))
    assert len(cards) == 8 and cards[7].index == 7
