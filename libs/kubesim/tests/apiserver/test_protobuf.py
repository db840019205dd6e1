"""Protobuf request bodies (``application/vnd.kubernetes.protobuf``) over real HTTP, built here
byte by byte the way client-go's gogo-protobuf writes them (every non-pointer field, zero or
not), and the malformed ones an attacker or a broken client sends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from rgpu_kubesim import SimApiServer

pytestmark = pytest.mark.anyio

PROTOBUF = {"Content-Type": "application/vnd.kubernetes.protobuf"}
Manifest = Callable[..., dict[str, Any]]


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def number(field: int, value: int) -> bytes:
    return varint(field << 3) + varint(value)


def data(field: int, payload: bytes | str) -> bytes:
    raw = payload.encode() if isinstance(payload, str) else payload
    return varint(field << 3 | 2) + varint(len(raw)) + raw


def entry(field: int, key: str, value: str) -> bytes:
    return data(field, data(1, key) + data(2, value))


def meta(name: str, *extra: bytes) -> bytes:
    """ObjectMeta as gogo writes it: strings 1-6, generation 7 and an empty Time 8 always."""
    fields = [data(1, name)] + [data(n, "") for n in range(2, 7)]
    return b"".join([*fields, number(7, 0), data(8, b""), *extra])


def envelope(api_version: str, kind: str, raw: bytes, encoding: str = "") -> bytes:
    type_meta = data(1, api_version) + data(2, kind)
    return b"k8s\x00" + data(1, type_meta) + data(2, raw) + data(3, encoding) + data(4, "")


async def test_a_namespace_sent_as_protobuf_is_created_with_its_labels_and_finalizers(
    client: httpx.AsyncClient, sim: SimApiServer
) -> None:
    labels = entry(11, "team", "ml") + entry(11, "tier", "gpu")
    spec = data(1, "example.com/cleanup")
    body = data(1, meta("ml", labels)) + data(2, spec) + data(3, data(1, ""))
    response = await client.post(
        "/api/v1/namespaces", content=envelope("v1", "Namespace", body), headers=PROTOBUF
    )
    assert response.status_code == 201, response.text
    stored = sim.store.get("namespaces", "ml")
    assert stored["metadata"]["labels"] == {
        "team": "ml",
        "tier": "gpu",
        "kubernetes.io/metadata.name": "ml",
    }
    assert stored["spec"]["finalizers"] == ["example.com/cleanup"]
    assert stored["status"]["phase"] == "Active"


async def test_zero_values_of_pointer_fields_are_kept_and_of_plain_fields_dropped(
    client: httpx.AsyncClient, sim: SimApiServer
) -> None:
    body = data(1, meta("batch")) + number(2, 0) + number(3, 0) + data(4, "")
    response = await client.post(
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        content=envelope("scheduling.k8s.io/v1", "PriorityClass", body),
        headers=PROTOBUF,
    )
    assert response.status_code == 201, response.text
    stored = sim.store.get("priorityclasses", "batch")
    assert stored["value"] == 0
    assert "globalDefault" not in stored and "description" not in stored


async def test_protobuf_delete_options_with_grace_zero_remove_a_bound_pod_at_once(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    sim.store.create("pods", pod("web"))
    sim.store.bind("web", "node-a")
    options = number(1, 0) + data(5, "")
    response = await client.request(
        "DELETE",
        "/api/v1/namespaces/default/pods/web",
        content=envelope("v1", "DeleteOptions", options),
        headers=PROTOBUF,
    )
    assert response.status_code == 200, response.text
    assert sim.store.list("pods") == []


async def test_a_protobuf_eviction_with_a_stale_uid_precondition_is_a_conflict(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    sim.store.create("pods", pod("web"))
    eviction = data(1, meta("web")) + data(2, data(2, data(1, "not-the-uid")))
    response = await client.post(
        "/api/v1/namespaces/default/pods/web/eviction",
        content=envelope("policy/v1", "Eviction", eviction),
        headers=PROTOBUF,
    )
    assert response.status_code == 409, response.text
    assert [p["metadata"]["name"] for p in sim.store.list("pods")] == ["web"]


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"kind": "Namespace"}', "must start with 'k8s\\x00'"),
        (b"k8s\x00\x0a", "a varint runs past the end of the message"),
        (b"k8s\x00" + varint(1 << 3 | 2) + b"\xff" * 11, "a varint is longer than 10 bytes"),
        (b"k8s\x00" + varint(2 << 3 | 2) + varint(1 << 30) + b"x", "runs past the end"),
        (b"k8s\x00" + varint(1 << 3 | 3), "unsupported wire type 3"),
        (envelope("v1", "Namespace", number(1, 5)), "Namespace.metadata came with wire type 0"),
        (envelope("v1", "Namespace", data(1, data(1, b"\xff\xfe"))), "is not UTF-8"),
        (envelope("v1", "Namespace", data(1, meta("ml")), encoding="gzip"), "content encoding"),
    ],
    ids=[
        "json-labelled-protobuf",
        "truncated",
        "overlong-varint",
        "length-past-the-end",
        "unknown-wire-type",
        "number-where-a-message-belongs",
        "name-not-utf8",
        "content-encoding",
    ],
)
async def test_malformed_protobuf_is_a_400_naming_the_problem_and_the_server_keeps_serving(
    client: httpx.AsyncClient, sim: SimApiServer, body: bytes, why: str
) -> None:
    response = await client.post("/api/v1/namespaces", content=body, headers=PROTOBUF)
    assert response.status_code == 400, response.text
    assert why in response.json()["message"]
    assert (await client.get("/api/v1/namespaces/default")).status_code == 200


async def test_a_kind_without_a_protobuf_decoder_is_415_saying_to_send_json(
    client: httpx.AsyncClient,
) -> None:
    body = envelope("v1", "Pod", data(1, meta("web")))
    response = await client.post("/api/v1/namespaces/default/pods", content=body, headers=PROTOBUF)
    assert response.status_code == 415
    message = response.json()["message"]
    assert "not v1 Pod" in message and "send it as application/json" in message


async def test_a_protobuf_body_of_another_kind_than_the_path_is_refused(
    client: httpx.AsyncClient,
) -> None:
    body = envelope("v1", "ConfigMap", data(1, meta("x")))
    response = await client.post("/api/v1/namespaces", content=body, headers=PROTOBUF)
    assert response.status_code == 400
    assert "does not match the resource" in response.json()["message"]
