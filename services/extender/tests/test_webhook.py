"""``/mutate`` over HTTP: through the ASGI app, on the real TLS listener with a trustme
certificate, and called by kubesim's admission chain the way kube-apiserver calls it."""

from __future__ import annotations

import base64
import ssl

import httpx
import orjson
import pytest

from rgpu_kubesim import run_apiserver

pytestmark = pytest.mark.anyio

UID = "d2b7f0a4-9c3e-4f1b-8a6d-5e4c3b2a1f09"


async def test_shared_fixture_review_is_answered_with_a_base64_json_patch(
    extender, load_fixture
) -> None:
    review = load_fixture("k8s/admission-review-pod-create.json")
    response = await extender.client.post("/mutate", json=review)
    assert response.status_code == 200
    body = response.json()
    assert body["kind"] == "AdmissionReview"
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["response"]["uid"] == UID
    assert body["response"]["allowed"] is True
    ops = orjson.loads(base64.b64decode(body["response"]["patch"]))
    assert {"op": "replace", "path": "/spec/schedulerName", "value": "rgpu-scheduler"} in ops
    labels = {"operation": "CREATE", "decision": "mutated"}
    assert extender.metric("rgpu_extender_webhook_decisions_total", labels) == 1


async def test_denial_is_counted_and_answered_200_with_allowed_false(extender, build) -> None:
    review = build.review(build.pod(nodeName="gpu-node-1"))
    response = await extender.client.post("/mutate", json=review)
    assert response.status_code == 200
    assert response.json()["response"]["allowed"] is False
    labels = {"operation": "CREATE", "decision": "denied"}
    assert extender.metric("rgpu_extender_webhook_decisions_total", labels) == 1


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{", "not valid JSON"),
        (b'{"apiVersion": "admission.k8s.io/v1", "request": {"uid": ""}}', "uid"),
        (b'{"apiVersion": "admission.k8s.io/v1beta1"}', "admission.k8s.io/v1"),
    ],
)
async def test_malformed_review_is_a_400_with_a_message(
    extender, body: bytes, fragment: str
) -> None:
    response = await extender.client.post(
        "/mutate", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert fragment in response.json()["message"]


async def test_tls_listener_presents_the_configured_certificate(
    serve_extender, cert_files, ca, load_fixture
) -> None:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    expected = ssl.PEM_cert_to_DER_cert(cert_files[0].read_text())
    async with (
        serve_extender() as (plain, tls),
        httpx.AsyncClient(verify=context, trust_env=False) as client,
    ):
        assert tls.startswith("https://127.0.0.1:")
        review = load_fixture("k8s/admission-review-pod-create.json")
        async with client.stream("POST", f"{tls}/mutate", json=review) as response:
            ssl_object = response.extensions["network_stream"].get_extra_info("ssl_object")
            presented = ssl_object.getpeercert(binary_form=True)
            await response.aread()
        assert response.status_code == 200
        assert response.json()["response"]["uid"] == UID
        assert presented == expected
        plain_reply = await client.get(f"{plain}/readyz")
        assert plain_reply.status_code == 200
        # One registry behind both listeners: the webhook's requests show on the scheduler's.
        metrics = (await client.get(f"{plain}/metrics")).text
        assert 'route="/mutate"' in metrics
        assert 'rgpu_extender_webhook_decisions_total{decision="mutated"' in metrics


async def test_tls_listener_is_refused_by_a_client_that_does_not_trust_the_ca(
    serve_extender,
) -> None:
    async with (
        serve_extender() as (_, tls),
        httpx.AsyncClient(verify=ssl.create_default_context(), trust_env=False) as client,
    ):
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await client.get(f"{tls}/healthz")


async def test_apiserver_admission_mutates_a_created_pod_and_guards_updates(
    build, serve_extender, webhook_configuration
) -> None:
    # A cluster of its own, entered after the extender, so it closes its webhook connections
    # first: the extender's graceful shutdown waits for open connections to go.
    async with (
        serve_extender() as (_, tls),
        run_apiserver() as cluster,
        httpx.AsyncClient(base_url=cluster.url, trust_env=False) as kube,
    ):
        cluster.store.create("namespaces", {"metadata": {"name": "ml-team"}})
        cluster.store.create(
            "mutatingwebhookconfigurations",
            webhook_configuration(tls, ["CREATE", "UPDATE"]),
        )
        the_pod = build.pod(build.container(count="1", wired=False), scheduler=None)
        del the_pod["metadata"]["uid"]
        created = await kube.post("/api/v1/namespaces/ml-team/pods", json=the_pod)
        assert created.status_code == 201, created.text
        stored = cluster.store.get("pods", "trainer-0", namespace="ml-team")
        assert stored["spec"]["schedulerName"] == "rgpu-scheduler"
        env = {e["name"] for e in stored["spec"]["containers"][0]["env"]}
        assert env == {"LUPINE_SERVER", "LUPINE_WORKLOAD_ID"}

        forged = {"metadata": {"annotations": {"hami.io/lupine-endpoint": "10.6.6.6:1"}}}
        patch_headers = {"content-type": "application/merge-patch+json", "x-sim-user": "mallory"}
        refused = await kube.patch(
            "/api/v1/namespaces/ml-team/pods/trainer-0", json=forged, headers=patch_headers
        )
        assert refused.status_code in (400, 403), refused.text
        assert "mallory" in refused.json()["message"]

        denied_pod = build.pod(name="pinned", nodeName="gpu-node-1")
        del denied_pod["metadata"]["uid"]
        denied = await kube.post("/api/v1/namespaces/ml-team/pods", json=denied_pod)
        assert denied.status_code == 403, denied.text
        assert "spec.nodeName" in denied.json()["message"]


async def test_a_lookalike_resource_is_allowed_with_a_warning_naming_the_resource_meant(
    extender, build
) -> None:
    typo = build.container(resources={"limits": {"nvidia.com/remote-gpus": "1"}})
    response = await extender.client.post("/mutate", json=build.review(build.pod(typo)))
    answer = response.json()["response"]
    assert answer["allowed"] is True
    (warning,) = answer["warnings"]
    assert "pod ml-team/trainer-0" in warning
    assert "nvidia.com/remote-gpus" in warning
    assert "did you mean nvidia.com/remote-gpu?" in warning


async def test_a_pod_asking_for_the_served_names_gets_no_warning(extender, build) -> None:
    response = await extender.client.post("/mutate", json=build.review(build.pod()))
    assert "warnings" not in response.json()["response"]
