"""Unmodified kubectl against the simulated apiserver (isolated from any real kubeconfig)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest
import yaml

from rgpu_kubesim import SimApiServer
from rgpu_kubesim.kubelet import RUN_SECONDS_ANNOTATION, KubeletConfig, KubeletEmulator

from .conftest import Kubectl

pytestmark = [pytest.mark.anyio, pytest.mark.process]

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: main
    image: nginx:1.25
"""
LEASE = """
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: holder, namespace: kube-system}
spec: {holderIdentity: me}
"""

WEBHOOKS = """
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: rgpu}
webhooks:
- name: pods.rgpu.example.io
  admissionReviewVersions: [v1]
  sideEffects: None
  clientConfig: {url: "https://127.0.0.1:9/mutate"}
  rules: [{operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [pods]}]
"""
ACCOUNT = """
apiVersion: v1
kind: ServiceAccount
metadata: {name: robot}
"""


async def test_create_from_manifest_then_get_as_table(kubectl: Kubectl, sim: SimApiServer) -> None:
    assert "pod/web created" in await kubectl("create", "-f", "-", stdin=POD)
    lines = (await kubectl("get", "pods")).splitlines()
    assert lines[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert lines[1].split()[:4] == ["web", "0/1", "Pending", "0"]
    assert sim.store.get("pods", "web")["metadata"]["labels"] == {"app": "web"}


async def test_get_as_json_and_yaml(
    kubectl: Kubectl, sim: SimApiServer, pod: Callable[..., Any]
) -> None:
    sim.store.create("pods", pod("a"))
    as_json = json.loads(await kubectl("get", "pod", "a", "-o", "json"))
    as_yaml = yaml.safe_load(await kubectl("get", "pods", "-o", "yaml"))
    assert as_json["metadata"]["uid"] == sim.store.get("pods", "a")["metadata"]["uid"]
    assert as_yaml["kind"] == "List" and as_yaml["items"][0]["metadata"]["name"] == "a"


async def test_label_and_annotate_change_the_stored_pod(
    kubectl: Kubectl, sim: SimApiServer, pod: Callable[..., Any]
) -> None:
    sim.store.create("pods", pod("a"))
    assert "pod/a labeled" in await kubectl("label", "pod", "a", "tier=gpu")
    assert "pod/a annotated" in await kubectl("annotate", "pod", "a", "note=hello")
    stored = sim.store.get("pods", "a")
    assert stored["metadata"]["labels"] == {"tier": "gpu"}
    assert stored["metadata"]["annotations"] == {"note": "hello"}
    assert "pod/a unlabeled" in await kubectl("label", "pod", "a", "tier-")
    assert not sim.store.get("pods", "a")["metadata"].get("labels")


async def test_delete_removes_the_pod(
    kubectl: Kubectl, sim: SimApiServer, pod: Callable[..., Any]
) -> None:
    sim.store.create("pods", pod("a"))
    assert 'pod "a" deleted' in await kubectl("delete", "pod", "a")
    assert sim.store.list("pods") == []


async def test_nodes_table_shows_readiness_and_roles(
    kubectl: Kubectl, sim: SimApiServer, node: Callable[..., Any]
) -> None:
    ready = {
        "conditions": [{"type": "Ready", "status": "True"}],
        "nodeInfo": {"kubeletVersion": "v1.32.0"},
    }
    sim.store.create(
        "nodes", {**node("gpu-a", **{"node-role.kubernetes.io/gpu": ""}), "status": ready}
    )
    lines = (await kubectl("get", "nodes", "-o", "wide")).splitlines()
    assert lines[0].split()[:5] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert lines[1].split()[:3] == ["gpu-a", "Ready", "gpu"]


async def test_group_resources_are_discovered(kubectl: Kubectl, sim: SimApiServer) -> None:
    assert "lease.coordination.k8s.io/holder created" in await kubectl(
        "create", "-f", "-", stdin=LEASE
    )
    listing = await kubectl("get", "leases", "-n", "kube-system")
    assert listing.splitlines()[1].split()[:2] == ["holder", "me"]
    assert "created" in await kubectl("create", "-f", "-", stdin=WEBHOOKS)
    configs = (await kubectl("get", "mutatingwebhookconfigurations")).splitlines()
    assert configs[0].split() == ["NAME", "WEBHOOKS", "AGE"]
    assert configs[1].split()[:2] == ["rgpu", "1"]


async def test_service_accounts_are_created_and_listed(kubectl: Kubectl) -> None:
    await kubectl("create", "-f", "-", stdin=ACCOUNT)
    table = (await kubectl("get", "serviceaccounts")).splitlines()
    assert table[0].split() == ["NAME", "SECRETS", "AGE"]
    assert table[1].split()[:2] == ["robot", "0"]


POLICY = """
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: inference}
value: 1000
globalDefault: true
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: trainers}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: train}}
"""


async def test_priority_classes_and_budgets_show_kubectls_columns(kubectl: Kubectl) -> None:
    await kubectl("create", "-f", "-", stdin=POLICY)
    classes = (await kubectl("get", "pc")).splitlines()
    assert classes[0].split() == ["NAME", "VALUE", "GLOBAL-DEFAULT", "AGE", "PREEMPTIONPOLICY"]
    rows = {line.split()[0]: line.split() for line in classes[1:]}
    assert rows["inference"][1:3] == ["1000", "true"]
    assert rows["system-node-critical"][1:3] == ["2000001000", "false"]
    budgets = (await kubectl("get", "pdb")).splitlines()
    assert budgets[0].split() == [
        "NAME",
        "MIN",
        "AVAILABLE",
        "MAX",
        "UNAVAILABLE",
        "ALLOWED",
        "DISRUPTIONS",
        "AGE",
    ]
    assert budgets[1].split()[:4] == ["trainers", "1", "N/A", "0"]


async def test_running_pod_shows_ready_and_its_ip_in_wide_output(
    kubectl: Kubectl, sim: SimApiServer, client: httpx.AsyncClient, pod: Callable[..., Any]
) -> None:
    address = {"type": "InternalIP", "address": "192.0.2.9"}
    sim.store.create("nodes", {"metadata": {"name": "n1"}, "status": {"addresses": [address]}})
    sim.store.create("pods", pod("web", metadata={"annotations": {RUN_SECONDS_ANNOTATION: "60"}}))
    sim.store.bind("web", "n1")
    emulator = KubeletEmulator(KubeletConfig(start_delay_seconds=0), client, lambda _: None)
    async with anyio.create_task_group() as tg:
        await tg.start(emulator.run)
        with anyio.fail_after(5):
            while sim.store.get("pods", "web")["status"].get("phase") != "Running":
                await anyio.sleep(0.01)
        lines = (await kubectl("get", "pods", "-o", "wide")).splitlines()
        tg.cancel_scope.cancel()
    assert lines[0].split()[:7] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"]
    row = lines[1].split()
    pod_ip = sim.store.get("pods", "web")["status"]["podIP"]
    assert (row[0], row[1], row[2], row[5], row[6]) == ("web", "1/1", "Running", pod_ip, "n1")


GATED = """
apiVersion: v1
kind: Pod
metadata: {name: trainer}
spec:
  schedulingGates: [{name: rgpu.io/admission}]
  containers: [{name: main, image: cuda-app:1}]
"""


async def test_a_gated_pod_shows_scheduling_gated_until_its_gate_is_removed(
    kubectl: Kubectl, sim: SimApiServer
) -> None:
    assert "pod/trainer created" in await kubectl("create", "-f", "-", stdin=GATED)
    row = (await kubectl("get", "pods")).splitlines()[1].split()
    assert row[:3] == ["trainer", "0/1", "SchedulingGated"]
    gate = '[{"op": "remove", "path": "/spec/schedulingGates/0"}]'
    assert "patched" in await kubectl("patch", "pod", "trainer", "--type=json", "-p", gate)
    assert not sim.store.get("pods", "trainer")["spec"].get("schedulingGates")
    sim.store.bind("trainer", "gpu-a")
    assert (await kubectl("get", "pods")).splitlines()[1].split()[2] == "Pending"


async def test_wide_output_counts_the_readiness_gates_whose_condition_is_true(
    kubectl: Kubectl, sim: SimApiServer, pod: Callable[..., Any]
) -> None:
    gates = [{"conditionType": "rgpu.io/remote-gpu-ready"}, {"conditionType": "example.com/lb"}]
    sim.store.create("pods", pod("web", spec={**pod("web")["spec"], "readinessGates": gates}))
    assert (await kubectl("get", "pods", "-o", "wide")).splitlines()[1].split()[-1] == "0/2"
    condition = {"type": "rgpu.io/remote-gpu-ready", "status": "True"}
    sim.store.patch(
        "pods",
        "web",
        {"status": {"conditions": [condition]}},
        patch_type="strategic",
        subresource="status",
    )
    lines = (await kubectl("get", "pods", "-o", "wide")).splitlines()
    assert lines[0].split()[-2:] == ["READINESS", "GATES"]
    assert lines[1].split()[-1] == "1/2"


async def test_create_with_an_unknown_field_is_refused_by_server_side_validation(
    sim: SimApiServer, kubectl: Kubectl
) -> None:
    manifest = POD.replace("    image: nginx:1.25", "    image: nginx:1.25\n    imagePolicy: x")
    with pytest.raises(
        AssertionError,
        match=r'strict decoding error: unknown field "spec\.containers\[0\]\.imagePolicy"',
    ):
        await kubectl("create", "-f", "-", stdin=manifest)
    assert sim.store.list("pods") == []


async def test_server_side_dry_run_creates_and_deletes_nothing(
    kubectl: Kubectl, sim: SimApiServer, pod: Callable[..., Any]
) -> None:
    assert "(server dry run)" in await kubectl("create", "--dry-run=server", "-f", "-", stdin=POD)
    assert sim.store.list("pods") == []
    sim.store.create("pods", pod("a"))
    assert "(server dry run)" in await kubectl("delete", "pod", "a", "--dry-run=server")
    assert [p["metadata"]["name"] for p in sim.store.list("pods")] == ["a"]


async def test_delete_namespace_waits_for_it_to_terminate_and_go(
    kubectl: Kubectl, sim: SimApiServer, pod: Callable[..., Any]
) -> None:
    sim.store.create("namespaces", {"metadata": {"name": "team"}})
    sim.store.create("pods", pod("a", namespace="team"))
    assert 'namespace "team" deleted' in await kubectl("delete", "namespace", "team")
    names = [n["metadata"]["name"] for n in sim.store.list("namespaces")]
    assert "team" not in names and sim.store.list("pods", namespace="team") == []


NETWORK_POLICY = """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: holders-only}
spec:
  podSelector:
    matchLabels: {app.kubernetes.io/name: lupine-server}
    matchExpressions: [{key: rgpu.io/server-node, operator: Exists}]
  ingress:
  - from: [{ipBlock: {cidr: 10.0.0.5/32}}]
    ports: [{port: 14833}]
"""


async def test_network_policies_are_applied_and_listed_with_their_pod_selector(
    kubectl: Kubectl,
) -> None:
    await kubectl("apply", "-f", "-", stdin=NETWORK_POLICY)
    table = (await kubectl("get", "netpol")).splitlines()
    assert table[0].split() == ["NAME", "POD-SELECTOR", "AGE"]
    assert table[1].split()[:2] == [
        "holders-only",
        "app.kubernetes.io/name=lupine-server,rgpu.io/server-node",
    ]
    stored = json.loads(await kubectl("get", "netpol", "holders-only", "-o", "json"))
    assert stored["spec"]["policyTypes"] == ["Ingress"]
    assert stored["spec"]["ingress"][0]["ports"] == [{"port": 14833, "protocol": "TCP"}]
