"""Card-seconds per namespace: integrated from the claims while this replica exports, reset
(never doubled) when the export moves (two replicas on kubesim: ``test_replicas``)."""

from __future__ import annotations

from rgpu_metrics.usage import Usage, UsageCollector


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_held_cards_are_integrated_between_claim_changes(make) -> None:
    clock, counting = Clock(), [True]
    usage = Usage(clock=clock)
    usage.count_while(lambda: counting[0])
    usage.claims_changed(make.claims(make.claim("gpu-a", [0, 1], namespace="a")))
    clock.now = 10.0
    both = (make.claim("gpu-a", [0, 1], namespace="a"), make.claim("gpu-b", [0], namespace="b"))
    usage.claims_changed(make.claims(*both))
    clock.now = 20.0
    assert usage.totals() == {"a": 40.0, "b": 10.0}


def test_a_replica_that_stops_exporting_forgets_and_starts_again_from_zero(make) -> None:
    clock, counting = Clock(), [True]
    usage = Usage(clock=clock)
    usage.count_while(lambda: counting[0])
    usage.claims_changed(make.claims(make.claim("gpu-a", [0], namespace="a")))
    clock.now = 100.0
    assert usage.totals() == {"a": 100.0}
    counting[0] = False
    clock.now = 150.0
    assert usage.totals() == {}
    counting[0] = True
    assert usage.totals() == {}
    clock.now = 160.0
    # Only the time exported since it took over: the 50 s it did not export are nobody's.
    assert usage.totals() == {"a": 10.0}


def test_the_counter_is_a_prometheus_counter_per_namespace(make) -> None:
    clock = Clock()
    usage = Usage(clock=clock)
    usage.count_while(lambda: True)
    usage.claims_changed(make.claims(make.claim("gpu-a", [0, 1], namespace="ml")))
    clock.now = 3.0
    (family,) = UsageCollector(usage).collect()
    assert family.type == "counter"
    assert [(s.name, s.labels, s.value) for s in family.samples] == [
        ("rgpu_namespace_card_seconds_total", {"namespace": "ml"}, 6.0)
    ]
