"""The metrics service end to end: real ASGI app, fake peers at the transport, parsed output."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable

import anyio
import httpx
import pytest
from prometheus_client.metrics_core import Metric

pytestmark = pytest.mark.anyio

HAMI_FAMILIES = (
    "hami_remote_gpu_memory_limit_bytes",
    "hami_remote_gpu_allocated",
    "hami_remote_gpu_overview",
)
STATES = ("unavailable", "unhealthy", "bound", "committed", "booked", "busy", "free")
MIB = 1 << 20

Scrape = Callable[..., Awaitable[dict[str, Metric]]]
Until = Callable[[Callable[[], Awaitable[bool]]], Awaitable[None]]


def samples(family: Metric, **match: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value)
        for s in family.samples
        if all(s.labels.get(k) == v for k, v in match.items())
    ]


def value(family: Metric, **match: str) -> float:
    (found,) = samples(family, **match)
    return found[1]


def shown_state(families: dict[str, Metric], card: str) -> str:
    on = [labels["state"] for labels, v in samples(families["rgpu_card_state"], card=card) if v]
    assert len(on) == 1, on
    return on[0]


@pytest.fixture
def every_state(make, peers):
    """Seven cards, one in each state, on a ready server and one that is not ready."""
    a = make.server("gpu-a", cards=6, busy=[4], unhealthy=[5])
    b = make.server("gpu-b", cards=1, ready=False, endpoint="10.0.0.2:14833")
    peers.discovery.publish(make.fleet(a, b, revision=2))
    peers.allocator.publish(
        make.claims(
            make.claim("gpu-a", [1], state="booked", pod="p-booked"),
            make.claim("gpu-a", [2], state="committed", pod="p-committed"),
            make.claim("gpu-a", [3], state="bound", pod="p-bound", namespace="team-b"),
            make.claim("gpu-b", [0], state="bound", pod="p-away"),
            revision=5,
        )
    )
    return {
        "gpu-a/GPU-gpu-a-0": "free",
        "gpu-a/GPU-gpu-a-1": "booked",
        "gpu-a/GPU-gpu-a-2": "committed",
        "gpu-a/GPU-gpu-a-3": "bound",
        "gpu-a/GPU-gpu-a-4": "busy",
        "gpu-a/GPU-gpu-a-5": "unhealthy",
        "gpu-b/GPU-gpu-b-0": "unavailable",
    }


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
async def test_every_card_appears_exactly_once_per_family_in_either_format(
    every_state, ready_client, scraper: Scrape, openmetrics: bool
):
    families = await scraper(ready_client, openmetrics=openmetrics)
    for name in HAMI_FAMILIES:
        counts = Counter(labels["device_uuid"] for labels, _ in samples(families[name]))
        assert counts == dict.fromkeys(every_state, 1), name
    states = Counter(
        (labels["card"], labels["state"]) for labels, _ in samples(families["rgpu_card_state"])
    )
    assert states == {(card, state): 1 for card in every_state for state in STATES}


async def test_each_card_shows_its_state_with_hami_values_and_labels(
    every_state, ready_client, scraper: Scrape
):
    families = await scraper(ready_client)
    for card, state in every_state.items():
        assert shown_state(families, card) == state, card
        held = state in ("booked", "committed", "bound", "busy") or card.startswith("gpu-b")
        labels, allocated = samples(families["hami_remote_gpu_allocated"], device_uuid=card)[0]
        assert allocated == int(held), card
        assert value(families["hami_remote_gpu_overview"], device_uuid=card) == (
            40960 * MIB if held else 0
        )
        assert value(families["hami_remote_gpu_memory_limit_bytes"], device_uuid=card) == (
            40960 * MIB
        )
        server = card.partition("/")[0]
        assert labels["server"] == server
        assert labels["device_type"] == "RemoteGPU"
        assert labels["device_index"] == card.rpartition("-")[2]
    overview, _ = samples(families["hami_remote_gpu_overview"], device_uuid="gpu-a/GPU-gpu-a-0")[0]
    assert overview["endpoint"] == "10.0.0.1:14833"
    assert (overview["device_cores"], overview["device_memory_limit"]) == ("100", "40960")


async def test_holder_info_names_the_claiming_pod_once_per_held_card(
    every_state, ready_client, scraper: Scrape
):
    families = await scraper(ready_client)
    holders = {
        labels["card"]: (labels["namespace"], labels["pod"], v)
        for labels, v in samples(families["rgpu_card_holder_info"])
    }
    assert holders == {
        "gpu-a/GPU-gpu-a-1": ("team-a", "p-booked", 1.0),
        "gpu-a/GPU-gpu-a-2": ("team-a", "p-committed", 1.0),
        "gpu-a/GPU-gpu-a-3": ("team-b", "p-bound", 1.0),
        "gpu-b/GPU-gpu-b-0": ("team-a", "p-away", 1.0),
    }


async def test_server_series_report_readiness_card_count_and_revisions(
    every_state, ready_client, scraper: Scrape, until: Until
):
    async def revised() -> bool:
        families = await scraper(ready_client)
        return "rgpu_claims_revision" in families and (value(families["rgpu_claims_revision"]) == 5)

    await until(revised)
    families = await scraper(ready_client)
    assert value(families["rgpu_server_up"], server="gpu-a", endpoint="10.0.0.1:14833") == 1
    assert value(families["rgpu_server_up"], server="gpu-b", endpoint="10.0.0.2:14833") == 0
    assert value(families["rgpu_server_cards"], server="gpu-a") == 6
    assert value(families["rgpu_server_cards"], server="gpu-b") == 1
    assert value(families["rgpu_fleet_revision"]) == 2
    assert value(families["rgpu_source_up"], source="discovery") == 1
    assert value(families["rgpu_source_up"], source="allocator") == 1


async def test_openmetrics_is_negotiated_by_accept_and_ends_with_one_eof(
    every_state, ready_client, scraper: Scrape
):
    accept = "application/openmetrics-text; version=1.0.0; charset=utf-8"
    response = await ready_client.get("/metrics", headers={"accept": accept})
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.endswith("\n# EOF\n")
    assert response.text.count("# EOF") == 1
    families = await scraper(ready_client, openmetrics=True)
    assert families["rgpu_card_holder"].type == "info"
    assert families["rgpu_card_state"].type == "gauge"


async def test_plain_scrape_answers_the_prometheus_text_format(every_state, ready_client):
    response = await ready_client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "# EOF" not in response.text
    assert int(response.headers["content-length"]) == len(response.content)


async def test_own_process_and_latency_metrics_share_the_scrape(ready_client, scraper: Scrape):
    await ready_client.get("/healthz")
    families = await scraper(ready_client)
    assert "process_cpu_seconds" in families
    assert "rgpu_http_request_duration_seconds" in families
    assert "python_info" in families


async def test_a_scrape_makes_no_request_to_either_source(
    every_state, peers, ready_client, scraper: Scrape, until: Until
):
    async def settled() -> bool:
        # Both followers are parked in a held long-poll once they asked with the latest revision.
        last = (peers.discovery.requests[-1], peers.allocator.requests[-1])
        return [r.url.params.get("since") for r in last] == ["2", "5"]

    await until(settled)
    await anyio.sleep(0.05)
    before = (len(peers.discovery.requests), len(peers.allocator.requests))
    for _ in range(20):
        await scraper(ready_client)
    assert (len(peers.discovery.requests), len(peers.allocator.requests)) == before


async def test_a_source_going_away_keeps_its_series_and_raises_its_age(
    every_state, peers, ready_client, scraper: Scrape, until: Until
):
    async def discovery_up(expected: float) -> bool:
        return value((await scraper(ready_client))["rgpu_source_up"], source="discovery") == (
            expected
        )

    await until(lambda: discovery_up(1))
    before = await scraper(ready_client)
    peers.discovery.set_mode("down")
    await until(lambda: discovery_up(0))
    first = value((await scraper(ready_client))["rgpu_source_age_seconds"], source="discovery")
    await anyio.sleep(0.2)
    after = await scraper(ready_client)
    assert value(after["rgpu_source_age_seconds"], source="discovery") >= first + 0.2
    for name in (*HAMI_FAMILIES, "rgpu_card_state", "rgpu_server_up", "rgpu_fleet_revision"):
        assert samples(after[name]) == samples(before[name]), name
    assert (await ready_client.get("/readyz")).status_code == 200


async def test_a_source_coming_back_is_followed_again(
    make, peers, ready_client, scraper: Scrape, until: Until
):
    peers.allocator.set_mode("error")

    async def allocator_up(expected: float) -> bool:
        return value((await scraper(ready_client))["rgpu_source_up"], source="allocator") == (
            expected
        )

    await until(lambda: allocator_up(0))
    peers.allocator.publish(make.claims(make.claim("gpu-a", [0, 1]), revision=9))

    async def claimed() -> bool:
        families = await scraper(ready_client)
        return shown_state(families, "gpu-a/GPU-gpu-a-0") == "bound"

    await until(claimed)
    families = await scraper(ready_client)
    assert value(families["rgpu_source_up"], source="allocator") == 1
    assert value(families["rgpu_source_age_seconds"], source="allocator") < 1.0


async def test_a_server_leaving_the_fleet_removes_all_its_series(
    every_state, make, peers, ready_client, scraper: Scrape, until: Until
):
    async def gpu_b_listed() -> bool:
        families = await scraper(ready_client)
        return bool(samples(families["rgpu_server_cards"], server="gpu-b"))

    await until(gpu_b_listed)
    peers.discovery.publish(make.fleet(make.server("gpu-a", cards=6), revision=3))
    await until(lambda: _not(gpu_b_listed))
    families = await scraper(ready_client)
    for family in families.values():
        assert not samples(family, server="gpu-b"), family.name
    assert {labels["device_uuid"] for labels, _ in samples(families[HAMI_FAMILIES[0]])} == {
        f"gpu-a/GPU-gpu-a-{i}" for i in range(6)
    }


async def _not(check: Callable[[], Awaitable[bool]]) -> bool:
    return not await check()


async def test_a_state_change_moves_the_card_between_state_series(
    make, peers, ready_client, scraper: Scrape, until: Until
):
    peers.allocator.publish(make.claims(make.claim("gpu-a", [0], state="booked"), revision=2))

    async def state_is(expected: str) -> bool:
        return shown_state(await scraper(ready_client), "gpu-a/GPU-gpu-a-0") == expected

    await until(lambda: state_is("booked"))
    peers.allocator.publish(make.claims(make.claim("gpu-a", [0], state="committed"), revision=3))
    await until(lambda: state_is("committed"))


async def test_readiness_waits_for_both_sources_then_holds(make, peers, open_client, until: Until):
    peers.allocator.set_mode("down")
    async with open_client() as client:

        async def discovery_answered() -> bool:
            return any("since" in r.url.params for r in peers.discovery.requests)

        await until(discovery_answered)
        response = await client.get("/readyz")
        assert response.status_code == 503
        assert "allocator" in response.json()["reason"]
        peers.allocator.publish(make.claims())

        async def ready() -> bool:
            return (await client.get("/readyz")).status_code == 200

        await until(ready)
        peers.allocator.set_mode("down")
        await anyio.sleep(0.05)
        assert (await client.get("/readyz")).status_code == 200


async def test_scrape_answers_before_any_source_has_answered(peers, open_client, scraper: Scrape):
    peers.discovery.set_mode("down")
    peers.allocator.set_mode("down")
    async with open_client() as client:
        families = await scraper(client)
        assert not samples(families["hami_remote_gpu_allocated"])
        assert "rgpu_source_age_seconds" in families
        assert not samples(families["rgpu_source_age_seconds"])
        assert (await client.get("/readyz")).status_code == 503


async def test_health_answers_ok(client: httpx.AsyncClient):
    response = await client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
