"""TokenRequest, TokenReview and bearer authentication over real HTTP, as kube-apiserver answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from rgpu_kubesim import ApiOptions, SimApiServer, run_apiserver

pytestmark = pytest.mark.anyio

NS = "rgpu-system"
REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"


@dataclass
class FakeClock:
    now: float = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def options(clock: FakeClock) -> ApiOptions:
    return ApiOptions(clock=clock)


def _cluster_binding(name: str, role: str, subject: dict[str, str]) -> dict[str, Any]:
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}
    return {"metadata": {"name": name}, "roleRef": ref, "subjects": [subject]}


RBAC = "/apis/rbac.authorization.k8s.io/v1"
NODE_READER = {
    "metadata": {"name": "node-reader"},
    "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}],
}


@pytest.fixture
async def api(sim: SimApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=sim.url) as client:
        await client.post("/api/v1/namespaces", json={"metadata": {"name": NS}})
        for name in ("allocator", "extender"):
            url = f"/api/v1/namespaces/{NS}/serviceaccounts"
            created = await client.post(url, json={"metadata": {"name": name}})
            assert created.status_code == 201, created.text
        # RBAC: "reviewer" may review tokens (kube's auth-delegator), the allocator list nodes.
        reviewer = {"kind": "User", "name": "reviewer"}
        allocator = {"kind": "ServiceAccount", "name": "allocator", "namespace": NS}
        for body, plural in (
            (
                _cluster_binding("reviewers", "system:auth-delegator", reviewer),
                "clusterrolebindings",
            ),
            (NODE_READER, "clusterroles"),
            (_cluster_binding("node-readers", "node-reader", allocator), "clusterrolebindings"),
        ):
            created = await client.post(f"{RBAC}/{plural}", json=body)
            assert created.status_code == 201, created.text
        yield client


async def issue(api: httpx.AsyncClient, account: str = "allocator", **spec: Any) -> httpx.Response:
    url = f"/api/v1/namespaces/{NS}/serviceaccounts/{account}/token"
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    return await api.post(url, json=body)


async def token(api: httpx.AsyncClient, account: str = "allocator", **spec: Any) -> str:
    reply = await issue(api, account, **spec)
    assert reply.status_code == 201, reply.text
    return str(reply.json()["status"]["token"])


async def review(
    api: httpx.AsyncClient, value: str, audiences: list[str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"token": value}
    if audiences is not None:
        spec["audiences"] = audiences
    reply = await api.post(REVIEWS, json={"kind": "TokenReview", "spec": spec})
    assert reply.status_code == 201, reply.text
    status: dict[str, Any] = reply.json()["status"]
    return status


async def test_token_request_answers_a_token_and_its_expiry(api: httpx.AsyncClient) -> None:
    reply = await issue(api, audiences=["rgpu"], expirationSeconds=900)
    assert reply.status_code == 201
    body = reply.json()
    assert body["kind"] == "TokenRequest"
    assert body["spec"]["audiences"] == ["rgpu"]
    assert body["status"]["expirationTimestamp"] == "2027-01-15T08:15:00Z"
    assert body["status"]["token"].count(".") == 2


async def test_token_request_defaults_to_an_hour_and_the_api_audience(
    api: httpx.AsyncClient,
) -> None:
    body = (await issue(api)).json()
    assert body["spec"]["expirationSeconds"] == 3600
    assert body["spec"]["audiences"] == [API_AUDIENCE]
    assert body["status"]["expirationTimestamp"] == "2027-01-15T09:00:00Z"


async def test_token_request_under_ten_minutes_is_invalid(api: httpx.AsyncClient) -> None:
    reply = await issue(api, expirationSeconds=599)
    assert reply.status_code == 422
    assert "spec.expirationSeconds" in reply.json()["message"]
    assert "less than 10 minutes" in reply.json()["message"]


async def test_token_request_for_a_missing_account_is_not_found(api: httpx.AsyncClient) -> None:
    reply = await issue(api, "nobody")
    assert reply.status_code == 404
    assert reply.json()["message"] == 'serviceaccounts "nobody" not found'


async def test_token_subresource_only_accepts_post(api: httpx.AsyncClient) -> None:
    reply = await api.get(f"/api/v1/namespaces/{NS}/serviceaccounts/allocator/token")
    assert reply.status_code == 405


async def test_review_of_a_fresh_token_names_the_account(api: httpx.AsyncClient) -> None:
    status = await review(api, await token(api, audiences=["rgpu"]), ["rgpu"])
    assert status["authenticated"] is True
    assert status["audiences"] == ["rgpu"]
    user = status["user"]
    assert user["username"] == f"system:serviceaccount:{NS}:allocator"
    assert user["groups"] == [
        "system:serviceaccounts",
        f"system:serviceaccounts:{NS}",
        "system:authenticated",
    ]
    account = await api.get(f"/api/v1/namespaces/{NS}/serviceaccounts/allocator")
    assert user["uid"] == account.json()["metadata"]["uid"]


async def test_review_of_another_account_gives_its_own_username(api: httpx.AsyncClient) -> None:
    status = await review(api, await token(api, "extender", audiences=["rgpu"]), ["rgpu"])
    assert status["user"]["username"] == f"system:serviceaccount:{NS}:extender"


async def test_review_with_the_wrong_audience_is_not_authenticated(
    api: httpx.AsyncClient,
) -> None:
    status = await review(api, await token(api, audiences=["other"]), ["rgpu"])
    assert status["authenticated"] is False
    assert status["error"] == (
        '[invalid bearer token, token audiences ["other"] is invalid for the target audiences '
        '["rgpu"]]'
    )


async def test_review_of_an_expired_token_is_not_authenticated(
    api: httpx.AsyncClient, clock: FakeClock
) -> None:
    value = await token(api, audiences=["rgpu"], expirationSeconds=600)
    clock.now += 599
    assert (await review(api, value, ["rgpu"]))["authenticated"] is True
    clock.now += 1
    status = await review(api, value, ["rgpu"])
    assert status["authenticated"] is False
    assert "service account token has expired" in status["error"]


@pytest.mark.parametrize("mangle", ["not-a-token", "a.b.c", "{sig}x"])
async def test_review_of_a_malformed_or_forged_token_is_not_authenticated(
    api: httpx.AsyncClient, mangle: str
) -> None:
    value = await token(api, audiences=["rgpu"])
    forged = mangle.format(sig=value)
    status = await review(api, forged, ["rgpu"])
    assert status["authenticated"] is False
    assert status["error"].startswith("[invalid bearer token, ")


async def test_token_from_another_cluster_does_not_verify(api: httpx.AsyncClient) -> None:
    async with run_apiserver() as other, httpx.AsyncClient(base_url=other.url) as there:
        await there.post("/api/v1/namespaces", json={"metadata": {"name": NS}})
        url = f"/api/v1/namespaces/{NS}/serviceaccounts"
        await there.post(url, json={"metadata": {"name": "allocator"}})
        foreign = await token(there, audiences=["rgpu"])
    status = await review(api, foreign, ["rgpu"])
    assert (
        status["error"]
        == "[invalid bearer token, square/go-jose: error in cryptographic primitive]"
    )


async def test_token_of_a_deleted_account_is_no_longer_valid(api: httpx.AsyncClient) -> None:
    value = await token(api, audiences=["rgpu"])
    await api.delete(f"/api/v1/namespaces/{NS}/serviceaccounts/allocator")
    assert (await review(api, value, ["rgpu"]))["authenticated"] is False


async def test_pod_bound_token_carries_the_pod_and_dies_with_it(api: httpx.AsyncClient) -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}
    created = (await api.post(f"/api/v1/namespaces/{NS}/pods", json=pod)).json()
    ref = {"kind": "Pod", "apiVersion": "v1", "name": "p", "uid": created["metadata"]["uid"]}
    value = await token(api, audiences=["rgpu"], boundObjectRef=ref)
    user = (await review(api, value, ["rgpu"]))["user"]
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == ["p"]
    await api.delete(f"/api/v1/namespaces/{NS}/pods/p")
    assert (await review(api, value, ["rgpu"]))["authenticated"] is False


async def test_review_without_a_token_is_a_bad_request(api: httpx.AsyncClient) -> None:
    reply = await api.post(REVIEWS, json={"spec": {}})
    assert reply.status_code == 400
    assert reply.json()["message"] == "token is required for TokenReview in authentication"


async def test_review_by_a_user_not_allowed_is_forbidden(api: httpx.AsyncClient) -> None:
    reply = await api.post(
        REVIEWS, json={"spec": {"token": "x"}}, headers={"X-Sim-User": "mallory"}
    )
    assert reply.status_code == 403
    assert 'User "mallory" cannot create resource "tokenreviews"' in reply.json()["message"]


async def test_tokenreviews_cannot_be_listed(api: httpx.AsyncClient) -> None:
    assert (await api.get(REVIEWS)).status_code == 405


async def test_bearer_token_makes_the_request_that_accounts(api: httpx.AsyncClient) -> None:
    value = await token(api, "extender")
    reply = await api.post(
        REVIEWS,
        json={"spec": {"token": value}},
        headers={"Authorization": f"Bearer {value}"},
    )
    assert reply.status_code == 403
    assert f'User "system:serviceaccount:{NS}:extender"' in reply.json()["message"]


async def test_bearer_token_of_the_api_audience_is_served(api: httpx.AsyncClient) -> None:
    value = await token(api)
    reply = await api.get("/api/v1/nodes", headers={"Authorization": f"Bearer {value}"})
    assert reply.status_code == 200


@pytest.mark.parametrize("audiences", [["rgpu"], None])
async def test_bearer_token_that_is_wrong_or_expired_is_unauthorized(
    api: httpx.AsyncClient, clock: FakeClock, audiences: list[str] | None
) -> None:
    value = await token(api, audiences=audiences or [API_AUDIENCE])
    if audiences is None:
        clock.now += 3600
    reply = await api.get("/api/v1/nodes", headers={"Authorization": f"Bearer {value}"})
    assert reply.status_code == 401
    assert reply.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }


async def test_request_without_a_token_keeps_the_user_agent_mapping(
    api: httpx.AsyncClient,
) -> None:
    reply = await api.post(
        REVIEWS, json={"spec": {"token": "x"}}, headers={"X-Sim-User": "reviewer"}
    )
    assert reply.status_code == 201


async def test_kubernetes_asyncio_issues_reviews_and_authenticates_with_tokens(
    sim: SimApiServer, api: httpx.AsyncClient
) -> None:
    async with k8s.ApiClient(k8s.Configuration(host=sim.url)) as admin:
        request = k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(audiences=["rgpu"], expiration_seconds=600)
        )
        issued = await k8s.CoreV1Api(admin).create_namespaced_service_account_token(
            "allocator", NS, request
        )
        review = k8s.V1TokenReview(
            spec=k8s.V1TokenReviewSpec(token=issued.status.token, audiences=["rgpu"])
        )
        answer = await k8s.AuthenticationV1Api(admin).create_token_review(review)
        assert answer.status.authenticated
        assert answer.status.user.username == f"system:serviceaccount:{NS}:allocator"
        own = await k8s.CoreV1Api(admin).create_namespaced_service_account_token(
            "allocator",
            NS,
            k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[])),
        )
    configuration = k8s.Configuration(host=sim.url, api_key={"BearerToken": own.status.token})
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    async with k8s.ApiClient(configuration) as as_account:
        assert (await k8s.CoreV1Api(as_account).list_node()).items == []
        with pytest.raises(ApiException) as refused:
            await k8s.AuthenticationV1Api(as_account).create_token_review(review)
    assert refused.value.status == 403
    assert f"system:serviceaccount:{NS}:allocator" in str(refused.value.body)
