"""Every reply has exactly the shape of the shared fixtures built from the Kubernetes Go types:
PascalCase extender keys, every field present, AdmissionReview v1 responses."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.anyio


def shape(value: Any) -> Any:
    """Keys (recursively) and JSON types, values ignored."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


async def test_filter_replies_have_the_fixture_keys_in_every_branch(
    open_extender, discovery, allocator, build, make, load_fixture
) -> None:
    keys = set(load_fixture("k8s/extender-filter-result.json"))
    async with open_extender() as extender:
        fit = await extender.client.post(
            "/filter", json=load_fixture("k8s/extender-filter-args.json")
        )
        allocator.no_fit = make.no_fit()
        no_fit = await extender.client.post("/filter", json=build.filter_args(build.pod(), ["a"]))
    for reply in (fit, no_fit):
        assert set(reply.json()) == keys
    expected = {k: type(v) for k, v in load_fixture("k8s/extender-filter-result.json").items()}
    assert {k: type(v) for k, v in fit.json().items()} == expected | {"FailedNodes": type(None)}
    assert isinstance(no_fit.json()["FailedNodes"], dict)


async def test_filter_error_reply_matches_the_error_fixture_shape(
    open_extender, discovery, build, load_fixture
) -> None:
    expected = load_fixture("k8s/extender-filter-result-error.json")
    discovery.available = False
    async with open_extender() as extender:
        reply = (
            await extender.client.post("/filter", json=build.filter_args(build.pod(), ["a"]))
        ).json()
    assert shape(reply) == shape(expected)
    assert {k: v for k, v in reply.items() if k != "Error"} == {
        k: v for k, v in expected.items() if k != "Error"
    }


async def test_bind_replies_match_the_ok_and_error_fixtures(
    extender, sim, build, allocator, load_fixture
) -> None:
    created = build.seed_pod(sim, build.pod())
    allocator.hold(created["metadata"]["uid"])
    args = load_fixture("k8s/extender-bind-args.json") | {"PodUID": created["metadata"]["uid"]}
    ok = (await extender.client.post("/bind", json=args)).json()
    assert ok == load_fixture("k8s/extender-bind-result-ok.json")
    error = (await extender.client.post("/bind", json=args | {"Node": "gpu-node-2"})).json()
    assert shape(error) == shape(load_fixture("k8s/extender-bind-result-error.json"))
    assert "already assigned to node" in error["Error"]


async def test_prioritize_reply_is_a_bare_array_of_the_fixture_shape(
    extender, load_fixture
) -> None:
    reply = await extender.client.post(
        "/prioritize", json=load_fixture("k8s/extender-prioritize-args.json")
    )
    assert shape(reply.json()) == shape(load_fixture("k8s/extender-prioritize-result.json"))


@pytest.mark.parametrize(
    ("fixture", "pod_spec"),
    [
        ("k8s/admission-review-response-allow.json", {"containers": [{"name": "web"}]}),
        ("k8s/admission-review-response-deny.json", {"nodeName": "n1"}),
        ("k8s/admission-review-response-patch.json", {}),
    ],
    ids=["allow", "deny", "patch"],
)
async def test_admission_responses_have_the_fixture_shape(
    extender, build, load_fixture, fixture: str, pod_spec: dict[str, Any]
) -> None:
    the_pod = build.pod(scheduler=None)
    the_pod["spec"] |= pod_spec
    reply = await extender.client.post("/mutate", json=build.review(the_pod))
    assert reply.status_code == 200
    assert shape(reply.json()) == shape(load_fixture(fixture))
