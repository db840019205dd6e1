"""Server-side field validation over HTTP: Strict refuses, Warn drops and warns, Ignore drops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from rgpu_kubesim import SimApiServer
from rgpu_kubesim.apiserver.endpoints._fields import prune

pytestmark = pytest.mark.anyio

Manifest = Callable[..., dict[str, Any]]
PODS = "/api/v1/namespaces/default/pods"


def _with_unknown(pod: Manifest) -> dict[str, Any]:
    body = pod("a")
    body["spec"]["foo"] = 1
    body["spec"]["containers"][0]["bar"] = "x"
    return body


async def test_strict_refuses_unknown_fields_naming_each(
    client: httpx.AsyncClient, pod: Manifest
) -> None:
    response = await client.post(
        PODS, params={"fieldValidation": "Strict"}, json=_with_unknown(pod)
    )
    assert response.status_code == 400
    status = response.json()
    assert status["reason"] == "BadRequest"
    assert status["message"] == (
        'Pod in version "v1" cannot be handled as a Pod: strict decoding error: '
        'unknown field "spec.containers[0].bar", unknown field "spec.foo"'
    )
    assert (await client.get(f"{PODS}/a")).status_code == 404


async def test_default_warn_drops_unknown_fields_and_says_so_in_warning_headers(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    response = await client.post(PODS, json=_with_unknown(pod))
    assert response.status_code == 201
    assert response.headers.get_list("warning") == [
        '299 - "unknown field \\"spec.containers[0].bar\\""',
        '299 - "unknown field \\"spec.foo\\""',
    ]
    stored = sim.store.get("pods", "a")
    assert "foo" not in stored["spec"] and "bar" not in stored["spec"]["containers"][0]


async def test_ignore_drops_unknown_fields_silently(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    response = await client.post(
        PODS, params={"fieldValidation": "Ignore"}, json=_with_unknown(pod)
    )
    assert response.status_code == 201 and "warning" not in response.headers
    assert "foo" not in sim.store.get("pods", "a")["spec"]


async def test_strict_applies_to_updates_and_patches(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    stored = sim.store.create("pods", pod("a"))
    stored["metadata"]["bogus"] = True
    put = await client.put(f"{PODS}/a", params={"fieldValidation": "Strict"}, json=stored)
    assert put.status_code == 400
    assert put.json()["message"] == (
        'Pod in version "v1" cannot be handled as a Pod: '
        'strict decoding error: unknown field "metadata.bogus"'
    )
    patch = await client.patch(
        f"{PODS}/a",
        params={"fieldValidation": "Strict"},
        content=orjson.dumps({"status": {"weird": 1}}),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert patch.status_code == 400
    assert patch.json()["message"] == 'strict decoding error: unknown field "status.weird"'


async def test_strict_reads_a_strategic_patch_past_its_directives_into_list_elements(
    client: httpx.AsyncClient, sim: SimApiServer, pod: Manifest
) -> None:
    sim.store.create("pods", pod("a"))
    headers = {"Content-Type": "application/strategic-merge-patch+json"}
    known = {
        "metadata": {"labels": {"x": "y"}},
        "spec": {
            "$setElementOrder/containers": [{"name": "main"}],
            "containers": [{"name": "main", "image": "busybox:1.37"}],
        },
    }
    ok = await client.patch(
        f"{PODS}/a",
        params={"fieldValidation": "Strict"},
        content=orjson.dumps(known),
        headers=headers,
    )
    assert ok.status_code == 200, ok.text
    unknown = {"spec": {"containers": [{"name": "main", "imagePolicy": "x"}]}}
    refused = await client.patch(
        f"{PODS}/a",
        params={"fieldValidation": "Strict"},
        content=orjson.dumps(unknown),
        headers=headers,
    )
    assert refused.status_code == 400
    assert refused.json()["message"] == (
        'strict decoding error: unknown field "spec.containers[0].imagePolicy"'
    )


async def test_known_fields_pass_strict_untouched(client: httpx.AsyncClient, pod: Manifest) -> None:
    body = pod("a")
    body["spec"]["containers"][0]["env"] = [
        {"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    ]
    body["spec"]["affinity"] = {"anything": {"below": "a free-form level"}}
    response = await client.post(PODS, params={"fieldValidation": "Strict"}, json=body)
    assert response.status_code == 201 and "warning" not in response.headers


async def test_unknown_field_validation_directive_is_422(
    client: httpx.AsyncClient, pod: Manifest
) -> None:
    response = await client.post(PODS, params={"fieldValidation": "Loose"}, json=pod("a"))
    assert response.status_code == 422
    assert response.json()["message"] == (
        'CreateOptions.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: "Loose": '
        'supported values: "", "Ignore", "Strict", "Warn"'
    )


@pytest.mark.parametrize(
    ("plural", "body", "unknown"),
    [
        ("leases", {"spec": {"holderIdentity": "a", "holder": "b"}}, ["spec.holder"]),
        ("namespaces", {"spec": {"finalizers": []}, "extra": 1}, ["extra"]),
        (
            "mutatingwebhookconfigurations",
            {"webhooks": [{"name": "w", "clientConfig": {"url": "u", "cert": "c"}}]},
            ["webhooks[0].clientConfig.cert"],
        ),
        ("events", {"reason": "x", "note": "y"}, ["note"]),
        ("nodes", {"spec": {"unschedulable": True, "cordon": True}}, ["spec.cordon"]),
    ],
)
def test_every_served_kind_has_known_fields(
    plural: str, body: dict[str, Any], unknown: list[str]
) -> None:
    assert prune(plural, body) == unknown
