"""The NetworkPolicy of one server, as written and as read back (pure)."""

from __future__ import annotations

from rgpu_allocator.pods import pod_info
from rgpu_allocator.policy_objects import (
    ANNOTATION_HOLDERS,
    NODE_LABEL,
    Fence,
    Holder,
    node_label,
    policy_body,
    policy_name,
    read_policy,
)

LABELS = (("app.kubernetes.io/name", "lupine-server"),)


def body(*holders: Holder, server: str = "gpu-1", node: str = "gpu-1") -> dict[str, object]:
    fence = Fence(server=server, node=node, port=14833, holders=holders)
    return policy_body(
        fence, namespace="rgpu-lupine", lupine_labels=LABELS, system_namespace="rgpu-system"
    )


def test_a_server_without_holders_admits_only_discoverys_probes_on_its_port() -> None:
    policy = body()
    spec = policy["spec"]
    assert spec["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "lupine-server", NODE_LABEL: "gpu-1"}
    }
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["ingress"] == [
        {
            "from": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "rgpu-system"}
                    },
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "rgpu-discovery"}},
                }
            ],
            "ports": [{"protocol": "TCP", "port": 14833}],
        }
    ]
    assert policy["metadata"]["annotations"][ANNOTATION_HOLDERS] == ""


def test_every_holder_is_admitted_by_each_of_its_addresses_and_nothing_wider() -> None:
    policy = body(
        Holder(pod="ml/a", ips=("10.1.0.5", "fd00::5")), Holder(pod="ml/b", ips=("10.1.0.6",))
    )
    rule = policy["spec"]["ingress"][1]
    assert rule["from"] == [
        {"ipBlock": {"cidr": "10.1.0.5/32"}},
        {"ipBlock": {"cidr": "fd00::5/128"}},
        {"ipBlock": {"cidr": "10.1.0.6/32"}},
    ]
    assert rule["ports"] == [{"protocol": "TCP", "port": 14833}]
    assert policy["metadata"]["annotations"][ANNOTATION_HOLDERS] == "ml/a,ml/b"


def test_names_and_labels_stay_valid_for_instances_and_long_node_names() -> None:
    assert policy_name("gpu-1") == "rgpu-server-gpu-1"
    instance = policy_name("gpu-1@14834")
    assert instance.startswith("rgpu-server-gpu-1-") and "@" not in instance
    long = "n" * 80 + ".example.com"
    assert len(node_label(long)) <= 63 and node_label(long) != node_label(long + "x")
    assert node_label("gpu-1") == "gpu-1"


def test_a_policy_read_back_says_exactly_what_was_written() -> None:
    written = body(Holder(pod="ml/a", ips=("10.1.0.5",)))
    stored = {**written, "metadata": {**written["metadata"], "resourceVersion": "7"}}
    record = read_policy(stored)
    assert record is not None and record.resource_version == "7" and record.server == "gpu-1"
    assert record.says(written)
    assert not record.says(body())
    assert read_policy({"metadata": {"name": "someone-elses"}, "spec": {}}) is None


def test_a_pods_addresses_are_read_from_pod_ips_then_pod_ip() -> None:
    def pod(status: dict[str, object]) -> tuple[str, ...]:
        info = pod_info({"metadata": {"uid": "u"}, "spec": {}, "status": status})
        assert info is not None
        return info.ips

    assert pod({"podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}) == (
        "10.0.0.1",
        "fd00::1",
    )
    assert pod({"podIP": "10.0.0.2"}) == ("10.0.0.2",)
    assert pod({"podIPs": "garbage"}) == ()
    assert pod({"podIPs": [{"ip": "10.0.0.1/32"}, {"ip": "fd00::1"}]}) == ("fd00::1",)
    assert pod({"podIP": "not-an-address"}) == ()
    assert pod({}) == ()
