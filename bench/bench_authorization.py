"""What the simulated apiserver's RBAC and admission policies cost per request, in process.

Run: ``python3 -m uv run --no-sync python bench/bench_authorization.py [--bindings 1000]``

The HTTP figure (pods created per second by a named user, every request authorized) is
``bench/bench_kubesim.py --user alice``; this isolates the decision itself, without the HTTP
stack's noise. Figures (medians of ``--rounds`` rounds of ``--decisions`` calls each):

* decision, seen kind     - a named user creating pods in its namespace, a kind of request the
  cache has answered (every pod of a workload after the first)
* decision, unseen kind   - the same with the cache dropped before each call: the rule index
  walk for a user among ``--bindings`` other users' bindings
* index rebuild           - after an RBAC write, the first decision rebuilds the index from
  every role and binding
* Lease policy            - rgpu's lease-owners ValidatingAdmissionPolicy (k8s/) judging an
  allowed write of discovery's (each probe-state heartbeat pays it)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from rgpu_kubesim.apiserver.admission import AdmissionPolicies
from rgpu_kubesim.apiserver.auth import (
    Aggregator,
    Authorizer,
    NamespaceGrants,
    UserGrant,
    named_user,
    seed,
)
from rgpu_kubesim.apiserver.kinds import Attributes, Request
from rgpu_kubesim.apiserver.storage import Storage
from rgpu_kubesim.machinery import require

CACHED_TARGET_US = 5.0
UNCACHED_TARGET_US = 100.0
REBUILD_TARGET_MS = 50.0
POLICY_TARGET_US = 500.0
POLICY = Path(__file__).resolve().parents[1] / "k8s" / "base" / "policies" / "lease-owners.yaml"
_PLURALS = {
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
}


def _cluster(bindings: int) -> tuple[Storage, Authorizer]:
    storage = Storage()
    authorizer = Authorizer(storage, default_user="kubernetes-admin", user_agents={})
    Aggregator(storage)
    seed(storage)
    NamespaceGrants(storage, UserGrant())
    for index in range(bindings):
        namespace = f"team-{index % 50}"
        if index < 50:
            storage.create(require("namespaces"), "", {"metadata": {"name": namespace}})
        subject = {"kind": "User", "name": f"user-{index}"}
        ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"}
        binding = {"metadata": {"name": f"b-{index}"}, "roleRef": ref, "subjects": [subject]}
        storage.create(require("rolebindings"), namespace, binding)
    return storage, authorizer


def _per_call(calls: int, rounds: int, call: Callable[[int], object]) -> float:
    """Median over rounds of seconds per call."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for index in range(calls):
            call(index)
        times.append((time.perf_counter() - started) / calls)
    return statistics.median(times)


def _policy_attrs(storage: Storage) -> tuple[AdmissionPolicies, Attributes]:
    policies = AdmissionPolicies(storage)
    storage.create(require("namespaces"), "", {"metadata": {"name": "rgpu-system"}})
    for document in yaml.safe_load_all(POLICY.read_text()):
        storage.create(require(_PLURALS[document["kind"]]), "", document)
    lease = {"metadata": {"name": "lupine-gpu-01"}, "spec": {"holderIdentity": "discovery-0"}}
    user = named_user("system:serviceaccount:rgpu-system:rgpu-discovery", ())
    attrs = Attributes(
        resource=require("leases"),
        subresource="",
        operation="UPDATE",
        namespace="rgpu-system",
        name="lupine-gpu-01",
        obj={"kind": "Lease", "apiVersion": "coordination.k8s.io/v1", **lease},
        old={"kind": "Lease", "apiVersion": "coordination.k8s.io/v1", **lease},
        kind="Lease",
        api_version="coordination.k8s.io/v1",
        user=user.username,
        namespace_labels={"kubernetes.io/metadata.name": "rgpu-system"},
        user_info=user.to_dict(),
    )
    return policies, attrs


def _row(label: str, value: str, target: str, ok: bool) -> None:
    print(f"{label:<44} {value:>12}   {target:<18} {'ok' if ok else 'MISSED'}")


def main(argv: Sequence[str] = sys.argv[1:]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bindings", type=int, default=1000)
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    storage, authorizer = _cluster(args.bindings)
    alice = named_user("alice", ())
    create = Request(verb="create", resource="pods", namespace="default")
    print(f"authorization bench: {args.bindings} bindings, median of {args.rounds} rounds")
    cached = _per_call(args.decisions, args.rounds, lambda _: authorizer.allows(alice, create))
    target = f"target < {CACHED_TARGET_US:.0f} µs"
    _row("decision, seen kind", f"{cached * 1e6:.2f} µs", target, cached * 1e6 < CACHED_TARGET_US)

    def unseen(_: int) -> object:
        authorizer._cache.clear()
        return authorizer.allows(alice, create)

    uncached = _per_call(args.decisions // 10, args.rounds, unseen)
    target = f"target < {UNCACHED_TARGET_US:.0f} µs"
    _row(
        "decision, unseen kind",
        f"{uncached * 1e6:.1f} µs",
        target,
        uncached * 1e6 < UNCACHED_TARGET_US,
    )

    def rebuilt(_: int) -> object:
        authorizer._invalidate(None)  # type: ignore[arg-type]
        return authorizer.allows(alice, create)

    rebuild = _per_call(10, args.rounds, rebuilt)
    target = f"target < {REBUILD_TARGET_MS:.0f} ms"
    _row(
        "index rebuild after an RBAC write",
        f"{rebuild * 1e3:.1f} ms",
        target,
        rebuild * 1e3 < REBUILD_TARGET_MS,
    )
    policies, attrs = _policy_attrs(storage)
    judged = _per_call(args.decisions // 10, args.rounds, lambda _: policies.validate(attrs))
    target = f"target < {POLICY_TARGET_US:.0f} µs"
    _row(
        "Lease policy, allowed write",
        f"{judged * 1e6:.0f} µs",
        target,
        judged * 1e6 < POLICY_TARGET_US,
    )


if __name__ == "__main__":
    main()
