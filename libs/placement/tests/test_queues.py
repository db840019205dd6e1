"""The queue policy: the configuration is checked whole, fair share orders namespaces by cards
held per weight within a priority, gangs are read from labels."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from rgpu_placement import (
    NO_QUEUES,
    FairWalk,
    Gang,
    QueueConfig,
    QueueConfigError,
    Quota,
    cards_by_namespace,
    gang_of,
)
from rgpu_testkit import claim, pod_ref


def test_an_empty_document_means_no_limit_and_weight_one() -> None:
    assert QueueConfig.from_mapping(None) == NO_QUEUES
    assert NO_QUEUES.quota("anyone") == Quota(cards=None, weight=1)


def test_listed_namespaces_get_their_own_quota_and_others_the_default() -> None:
    config = QueueConfig.from_mapping(
        {"default": {"cards": 16}, "namespaces": {"team-a": {"cards": 8, "weight": 2}}}
    )
    assert config.quota("team-a") == Quota(cards=8, weight=2)
    assert config.quota("team-b") == Quota(cards=16, weight=1)


@pytest.mark.parametrize(
    ("raw", "path", "words"),
    [
        ([1, 2], "", "expected a mapping"),
        ({"defaults": {}}, "defaults", "unknown key"),
        ({"default": {"card": 3}}, "default.card", "unknown key"),
        ({"default": {"cards": -1}}, "default.cards", "expected 0.."),
        ({"default": {"cards": 1.5}}, "default.cards", "expected a whole number"),
        ({"default": {"cards": "8"}}, "default.cards", "expected a whole number"),
        ({"default": {"cards": True}}, "default.cards", "expected a whole number"),
        ({"default": {"weight": 0}}, "default.weight", "expected 1.."),
        ({"namespaces": {"Team_A": {"cards": 1}}}, "namespaces.Team_A", "namespace name"),
        ({"namespaces": {"a": 3}}, "namespaces.a", "expected a mapping"),
        ({"namespaces": ["a"]}, "namespaces", "expected a mapping"),
    ],
)
def test_a_bad_document_names_the_path_and_is_never_read_as_no_limit(
    raw: object, path: str, words: str
) -> None:
    with pytest.raises(QueueConfigError) as caught:
        QueueConfig.from_mapping(raw)
    assert caught.value.path == path
    assert words in caught.value.reason


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    priority: int = 0


def walk(pods: list[Pod], config: QueueConfig, held: dict[str, int] | None = None) -> list[str]:
    """Admit every offered pod with one card; the names in the order admitted."""
    fair = FairWalk(
        pods,
        namespace=lambda p: p.namespace,
        priority=lambda p: p.priority,
        held=held or {},
        config=config,
    )
    taken = []
    for pod in fair:
        taken.append(pod.name)
        fair.took(pod.namespace, 1)
    return taken


def test_weights_one_and_three_share_forty_admissions_one_to_three() -> None:
    pods = [Pod(f"a{i}", "team-a") for i in range(40)] + [Pod(f"b{i}", "team-b") for i in range(40)]
    config = QueueConfig.from_mapping(
        {"namespaces": {"team-a": {"weight": 1}, "team-b": {"weight": 3}}}
    )
    first = walk(pods, config)[:40]
    a = sum(n.startswith("a") for n in first)
    assert abs(a - 10) <= 1
    assert abs((40 - a) - 30) <= 1


def test_the_namespace_holding_fewer_cards_goes_first() -> None:
    pods = [Pod("a0", "team-a"), Pod("b0", "team-b")]
    assert walk(pods, NO_QUEUES, held={"team-a": 5})[0] == "b0"


def test_priority_comes_before_fair_share() -> None:
    pods = [Pod("a0", "team-a"), Pod("b-urgent", "team-b", priority=100)]
    assert walk(pods, NO_QUEUES, held={"team-b": 50}) == ["b-urgent", "a0"]


def test_a_unit_not_taken_lets_its_namespace_offer_the_next() -> None:
    pods = [Pod("a-big", "team-a"), Pod("a-small", "team-a"), Pod("b0", "team-b")]
    fair = FairWalk(
        pods, namespace=lambda p: p.namespace, priority=lambda p: 0, held={}, config=NO_QUEUES
    )
    assert [p.name for p in fair] == ["a-big", "a-small", "b0"]


@pytest.mark.parametrize(
    ("labels", "gang"),
    [
        ({}, None),
        ({"rgpu.io/gang": "job"}, Gang(namespace="ml", name="job", size=None)),
        (
            {"rgpu.io/gang": "job", "rgpu.io/gang-size": "3"},
            Gang(namespace="ml", name="job", size=3),
        ),
        (
            {"rgpu.io/gang": "job", "rgpu.io/gang-size": "0"},
            Gang(namespace="ml", name="job", size=None),
        ),
        (
            {"rgpu.io/gang": "job", "rgpu.io/gang-size": "x"},
            Gang(namespace="ml", name="job", size=None),
        ),
        (
            {"rgpu.io/gang": "job", "rgpu.io/gang-size": "99999999"},
            Gang(namespace="ml", name="job", size=None),
        ),
    ],
)
def test_a_gang_is_read_from_its_labels(labels: dict[str, str], gang: Gang | None) -> None:
    assert gang_of("ml", labels) == gang


def test_cards_are_counted_per_pod_namespace_across_servers() -> None:
    held = (
        claim(server="gpu-a", cards=(0, 1), pod=pod_ref(name="a", namespace="team-a")),
        claim(server="gpu-b", cards=(0,), pod=pod_ref(name="b", namespace="team-a")),
        claim(server="gpu-b", cards=(1,), pod=pod_ref(name="c", namespace="team-b")),
    )
    assert cards_by_namespace(held) == {"team-a": 3, "team-b": 1}
    assert cards_by_namespace(()) == {}
