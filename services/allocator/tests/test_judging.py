"""Which claims block, and which of lupine's busy reports still count."""

from __future__ import annotations

from rgpu_allocator.claims import LeaseRecord
from rgpu_allocator.judging import occupancy_of
from rgpu_allocator.ledger import Ledger
from rgpu_allocator.occupancy import Occupancy
from rgpu_allocator.pods import PodIndex, PodInfo
from rgpu_allocator.settled import Settled
from rgpu_contracts import CardId, Claim, ClaimState, PodUID, ServerName
from rgpu_placement import Choice, FleetView, Refusal, choose, demand_of

KEYS = ("rack",)


def holder_claim(build, state=ClaimState.BOUND, node="client-1") -> Claim:
    return Claim(
        pod=build.pod("holder"),
        server=ServerName("a"),
        cards=(CardId(f"a/{build.uuid('a', 0)}"),),
        containers=(),
        state=state,
        booked_at=100.0,
        node=node,
    )


def lease(version: str, claims: tuple[Claim, ...]) -> LeaseRecord:
    return LeaseRecord(
        name="rgpu-a", server=ServerName("a"), resource_version=version, claims=claims
    )


def setup(build, claim: Claim | None, phase: str = "Running", observed_at: float = 50.0):
    """One server whose card 0 lupine reports busy, optionally claimed by ``holder``."""
    clock = [200.0]
    ledger, pods = Ledger(clock=lambda: clock[0]), PodIndex()
    claims = (claim,) if claim is not None else ()
    ledger.replace_all(
        [LeaseRecord(name="rgpu-a", server=ServerName("a"), resource_version="1", claims=claims)]
    )
    pods.put(
        PodInfo(
            uid=PodUID("uid-holder"),
            namespace="ml",
            name="holder",
            node_name="client-1",
            phase=phase,
            scheduler_name="rgpu-scheduler",
            has_allocated=True,
        )
    )
    fleet = build.fleet(build.server("a", cards=2, busy=(0,)))
    fleet = type(fleet)(revision=1, observed_at=observed_at, servers=fleet.servers)
    view = FleetView.build(fleet, None, KEYS)

    def occupancy() -> Occupancy:
        return occupancy_of(
            ledger, pods, uid="uid-new", now=clock[0], ttl=30.0, observed_at=observed_at
        )

    return ledger, view, occupancy


def decide(build, view, held):
    return choose(view, demand_of((build.container(),)), held, granularity="server")


def test_busy_card_no_claim_explains_keeps_the_server_refused(build):
    _, view, occupancy = setup(build, None)
    result = decide(build, view, occupancy())
    assert isinstance(result, Refusal)
    assert result.nofit.message == "2/2 CardBusyOnServer"
    assert result.blocked_by_claims == ()


def test_busy_card_of_a_running_holder_blocks_and_counts_as_blocked_by_claims(build):
    _, view, occupancy = setup(build, holder_claim(build))
    result = decide(build, view, occupancy())
    assert isinstance(result, Refusal)
    assert result.nofit.message == "2/2 ExclusiveDeviceAllocateConflict"
    assert result.blocked_by_claims == ("a",)


def test_busy_report_of_a_finished_holder_is_stale(build):
    _, view, occupancy = setup(build, holder_claim(build), phase="Succeeded")
    assert isinstance(decide(build, view, occupancy()), Choice)


def test_busy_report_older_than_the_release_is_stale(build):
    ledger, view, occupancy = setup(build, holder_claim(build), observed_at=50.0)
    ledger.apply(
        LeaseRecord(name="rgpu-a", server=ServerName("a"), resource_version="2", claims=())
    )
    assert isinstance(decide(build, view, occupancy()), Choice)


def test_busy_report_newer_than_the_release_counts(build):
    ledger, view, occupancy = setup(build, holder_claim(build), observed_at=500.0)
    ledger.apply(
        LeaseRecord(name="rgpu-a", server=ServerName("a"), resource_version="2", claims=())
    )
    result = decide(build, view, occupancy())
    assert isinstance(result, Refusal)
    assert result.nofit.message == "2/2 CardBusyOnServer"


def test_an_expired_booking_never_explains_a_busy_card(build):
    # The booked pod never ran, so whoever lupine reports on its card is someone else.
    booked = holder_claim(build, state=ClaimState.BOOKED, node=None)
    ledger, view, occupancy = setup(build, booked, phase="Pending")
    ledger.apply(
        LeaseRecord(name="rgpu-a", server=ServerName("a"), resource_version="2", claims=())
    )
    result = decide(build, view, occupancy())
    assert isinstance(result, Refusal)
    assert result.nofit.message == "2/2 CardBusyOnServer"


# -- verdicts remembered across decisions (Settled) ---------------------------------------------


def settled_setup(build, claim: Claim, *, node: str | None = "client-1"):
    """Server ``a`` (idle) with ``claim`` for ``holder``; decisions share one ``Settled``."""
    ledger, pods, settled = Ledger(), PodIndex(), Settled()
    ledger.replace_all([lease("1", (claim,))])
    pods.put(holder_pod(node=node))
    view = FleetView.build(build.fleet(build.server("a", cards=2)), None, KEYS)

    def decide_at(now: float, uid: str = "uid-new") -> Choice | Refusal:
        held = occupancy_of(ledger, pods, uid=uid, now=now, ttl=30.0, settled=settled)
        return decide(build, view, held)

    return ledger, pods, decide_at


def holder_pod(*, node: str | None = "client-1", phase: str = "Running") -> PodInfo:
    return PodInfo(
        uid=PodUID("uid-holder"),
        namespace="ml",
        name="holder",
        node_name=node,
        phase=phase,
        scheduler_name="rgpu-scheduler",
        has_allocated=True,
    )


def test_a_bound_holders_remembered_verdict_keeps_blocking_later_decisions(build):
    _, _, decide_at = settled_setup(build, holder_claim(build))
    assert isinstance(decide_at(200.0), Refusal)
    assert isinstance(decide_at(10_000.0), Refusal)


def test_a_holder_finishing_frees_its_server_though_its_verdict_was_remembered(build):
    _, pods, decide_at = settled_setup(build, holder_claim(build))
    assert isinstance(decide_at(200.0), Refusal)
    pods.put(holder_pod(phase="Succeeded"))
    assert isinstance(decide_at(201.0), Choice)


def test_a_newer_lease_version_is_judged_again(build):
    ledger, _, decide_at = settled_setup(build, holder_claim(build))
    assert isinstance(decide_at(200.0), Refusal)
    ledger.replace_all([lease("2", ())])
    assert isinstance(decide_at(201.0), Choice)


def test_an_unbound_holders_claim_is_judged_at_each_decisions_time(build):
    claim = holder_claim(build, state=ClaimState.BOOKED)
    _, _, decide_at = settled_setup(build, claim, node=None)
    assert isinstance(decide_at(120.0), Refusal), "booked 20 s ago: within the 30 s TTL"
    assert isinstance(decide_at(140.0), Choice), "40 s ago and still unbound: lapsed"


def test_the_deciding_pods_own_remembered_claim_does_not_block_it(build):
    _, _, decide_at = settled_setup(build, holder_claim(build))
    assert isinstance(decide_at(200.0), Refusal)
    assert isinstance(decide_at(201.0, uid="uid-holder"), Choice)


def test_an_unbound_holders_remembered_verdict_lasts_exactly_until_its_booking_lapses(build):
    claim = holder_claim(build, state=ClaimState.BOOKED)
    _, _, decide_at = settled_setup(build, claim, node=None)
    assert isinstance(decide_at(120.0), Refusal)
    assert isinstance(decide_at(129.9), Refusal), "remembered, and still within the TTL"
    assert isinstance(decide_at(130.0), Choice), "booked at 100 with a 30 s TTL: lapsed"


def test_a_lapsed_booking_on_an_untrusted_cache_keeps_blocking_after_a_remembered_verdict(build):
    claim = holder_claim(build, state=ClaimState.BOOKED)
    ledger, pods, settled = Ledger(), PodIndex(), Settled()
    ledger.replace_all([lease("1", (claim,))])
    pods.put(holder_pod(node=None))
    view = FleetView.build(build.fleet(build.server("a", cards=2)), None, KEYS)

    def decide_at(now: float, *, trusted: bool) -> Choice | Refusal:
        held = occupancy_of(
            ledger, pods, uid="uid-new", now=now, ttl=30.0, settled=settled, trusted=trusted
        )
        return decide(build, view, held)

    assert isinstance(decide_at(120.0, trusted=True), Refusal)
    # The binding may only have been missed by a silent watch: unknown, so it still blocks.
    assert isinstance(decide_at(140.0, trusted=False), Refusal)
    assert isinstance(decide_at(140.0, trusted=True), Choice)
