"""The one-lupine-per-GPU annotation and the names it gives servers."""

from __future__ import annotations

import pytest

from rgpu_contracts import (
    ContractError,
    LupineInstance,
    Server,
    ServerName,
    card_id,
    decode_device_cordon,
    decode_devices,
    decode_instances,
    encode_device_cordon,
    encode_devices,
    encode_instances,
    instance_server_name,
    node_of_server,
    split_card_id,
)
from rgpu_contracts.hami import DeviceEntry


def test_instances_decode_in_order_with_their_ports_and_gpus() -> None:
    text = '[{"port":14834,"gpus":["GPU-a"]},{"port":14835,"gpus":["GPU-b"," GPU-c "]}]'
    found = decode_instances(text)
    assert [(i.port, i.gpus) for i in found] == [(14834, ("GPU-a",)), (14835, ("GPU-b", "GPU-c"))]
    assert decode_instances(encode_instances(found)) == found


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("not json", "not JSON"),
        ("{}", "array"),
        ("[]", "1 to 64"),
        ('[{"port":0,"gpus":["GPU-a"]}]', "[0].port"),
        ('[{"port":"14834","gpus":["GPU-a"]}]', "[0].port"),
        ('[{"port":14834,"gpus":[]}]', "[0].gpus"),
        ('[{"port":14834}]', "[0].gpus"),
        ('[{"port":14834,"gpus":["GPU-a"]},{"port":14834,"gpus":["GPU-b"]}]', "used twice"),
        ('[{"port":1,"gpus":["GPU-a"]},{"port":2,"gpus":["GPU-a"]}]', "already served"),
        ("[" + ",".join(f'{{"port":{p},"gpus":["G{p}"]}}' for p in range(1, 66)) + "]", "1 to 64"),
    ],
)
def test_unusable_instance_annotations_raise_a_contract_error_naming_the_entry(
    text: str, where: str
) -> None:
    with pytest.raises(ContractError, match=where.replace("[", r"\[").replace("]", r"\]")):
        decode_instances(text)


def test_an_instance_name_survives_card_ids_and_the_device_codec() -> None:
    server = instance_server_name("gpu-a", 14834)
    card = card_id(server, "GPU-1")
    assert split_card_id(card) == (server, "GPU-1")
    entry = DeviceEntry(card=card, memory_mib=40960, cores=100)
    assert decode_devices(encode_devices([[entry]])) == ((entry,),)
    assert node_of_server(server) == "gpu-a"
    assert node_of_server("gpu-a") == "gpu-a"


def test_a_device_cordon_ignores_blanks_and_empty_entries() -> None:
    assert decode_device_cordon(" GPU-x, GPU-y ,,") == {"GPU-x", "GPU-y"}
    assert decode_device_cordon(None) == frozenset()
    assert encode_device_cordon(["GPU-y", "GPU-x", "GPU-x", " "]) == "GPU-x,GPU-y"


def test_a_cuda_major_is_read_from_the_version_and_unknown_when_unreadable() -> None:
    def major(version: str | None) -> int | None:
        return Server(
            name=ServerName("s"),
            endpoint=None,
            port=1,
            ready=True,
            reachable=True,
            usage_reported=False,
            busy=frozenset(),
            topology=(),
            cards=(),
            cuda_version=version,
        ).cuda_major

    assert major("12.4") == 12
    assert major("11") == 11
    assert major(None) is None
    assert major("twelve") is None
    assert major("") is None


def test_lupine_instance_refuses_a_blank_gpu() -> None:
    with pytest.raises(ContractError, match="gpus"):
        LupineInstance.from_dict({"port": 1, "gpus": [" "]})
