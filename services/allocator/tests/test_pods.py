"""Slimming raw pods into the cache."""

from __future__ import annotations

from rgpu_allocator.pods import PodIndex, pod_info
from rgpu_contracts import PodUID


def test_pod_info_keeps_only_what_allocation_needs(load_fixture):
    raw = load_fixture("k8s/pod-list-rv0.json")["items"][0]
    info = pod_info(raw)
    assert info is not None
    assert info.uid == raw["metadata"]["uid"]
    assert info.namespace == raw["metadata"]["namespace"]
    assert info.scheduler_name == raw["spec"].get("schedulerName", "default-scheduler")
    assert info.phase == raw["status"]["phase"]


def test_pod_info_reads_binding_and_allocated_annotation():
    raw = {
        "metadata": {
            "uid": "u",
            "namespace": "n",
            "name": "p",
            "annotations": {"hami.io/remote-gpu-devices-allocated": "x;"},
        },
        "spec": {"nodeName": "node-1", "schedulerName": "rgpu-scheduler"},
        "status": {"phase": "Running"},
    }
    info = pod_info(raw)
    assert info.bound
    assert info.has_allocated
    assert not info.finished
    assert info.ref.key == "n/p"


def test_pod_without_uid_is_skipped_and_missing_fields_default():
    assert pod_info({"metadata": {}}) is None
    info = pod_info({"metadata": {"uid": "u"}})
    assert info.phase == "Pending"
    assert info.node_name is None


def test_replace_all_reports_changes_and_buries_vanished_pods():
    index = PodIndex()
    a = pod_info({"metadata": {"uid": "a"}})
    b = pod_info({"metadata": {"uid": "b"}})
    c = pod_info({"metadata": {"uid": "c"}})
    index.put(a)
    index.put(b)
    by_uid, buried = index.by_uid, index.buried
    changes = index.replace_all({PodUID("b"): b, PodUID("c"): c})
    assert changes == [(a, None), (None, c)]
    assert len(index) == 2
    assert index.synced
    assert index.gone("a")
    assert not index.gone("b")
    # The read-only tables a decision reads follow the fresh list (never left on the old one).
    assert sorted(by_uid) == ["b", "c"]
    assert "a" in buried


def test_tombstones_are_bounded_oldest_first():
    index = PodIndex(tombstones=2)
    for uid in ("a", "b", "c"):
        index.remove(uid)
    assert [index.gone(u) for u in ("a", "b", "c")] == [False, True, True]


def test_pod_info_reads_what_preemption_needs():
    raw = {
        "metadata": {"uid": "u", "namespace": "n", "name": "p"},
        "spec": {
            "priority": 1000,
            "preemptionPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
        },
        "status": {"phase": "Running", "startTime": "2026-01-02T03:04:05Z"},
    }
    info = pod_info(raw)
    assert (info.priority, info.never_preempts, info.grace_seconds) == (1000, True, 5.0)
    assert info.started_at == 1767323045.0


def test_a_pod_without_priority_fields_has_priority_zero_and_the_default_grace():
    info = pod_info({"metadata": {"uid": "u"}, "spec": {"priority": True}, "status": {}})
    assert (info.priority, info.never_preempts, info.grace_seconds) == (0, False, 30.0)
    assert info.started_at is None
    garbled = pod_info({"metadata": {"uid": "u"}, "status": {"startTime": "yesterday"}})
    assert garbled.started_at is None


def test_pods_asked_to_stop_are_listed_until_they_end_or_a_list_says_otherwise():
    index = PodIndex()
    stopping = {"metadata": {"uid": "a", "deletionTimestamp": "2026-12-01T00:00:00Z"}}
    index.put(pod_info(stopping))
    index.put(pod_info({"metadata": {"uid": "b"}}))
    assert index.deleting() == {"a"}
    index.remove("a")
    assert index.deleting() == frozenset()
    index.replace_all(
        {PodUID("c"): pod_info({**stopping, "metadata": {**stopping["metadata"], "uid": "c"}})}
    )
    assert index.deleting() == {"c"}
    index.put(pod_info({"metadata": {"uid": "c"}}))
    assert index.deleting() == frozenset()
