"""Property tests: encode→decode is the identity, and no JSON value makes ``from_dict`` raise
anything but ``ContractError``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rgpu_contracts import (
    AdmissionQueue,
    AdmissionRequest,
    Allocation,
    AllocationRequest,
    Card,
    CardId,
    Claim,
    ClaimSet,
    ClaimState,
    ClaimsUpdate,
    CommitRequest,
    ContainerAssignment,
    ContainerKind,
    ContainerRequest,
    ContractError,
    DeviceEntry,
    ErrorBody,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    Fleet,
    FleetUpdate,
    GpuUuid,
    HostPriority,
    NamespaceShare,
    NodeName,
    NoFit,
    PodRef,
    PodUID,
    QueuedPod,
    Reason,
    ReasonCount,
    Server,
    ServerName,
    ServerVerdict,
    Topology,
    decode_devices,
    decode_register,
    encode_devices,
)

names = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,14}[a-z0-9])?", fullmatch=True)
uuids = st.from_regex(r"GPU-[0-9a-f]{1,12}", fullmatch=True).map(GpuUuid)
small = st.integers(min_value=0, max_value=2**31 - 1)
times = st.floats(min_value=0, max_value=4e9, allow_nan=False)


@st.composite
def cards(draw: st.DrawFn, server: str) -> Card:
    uuid = draw(uuids)
    return Card(
        id=CardId(f"{server}/{uuid}"),
        server=ServerName(server),
        uuid=uuid,
        index=draw(st.integers(0, 15)),
        memory_mib=draw(small),
        cores=draw(st.integers(0, 100)),
        model=draw(st.sampled_from(["", "NVIDIA-A100-SXM4-80GB", "H100"])),
        numa=draw(st.integers(0, 3)),
        healthy=draw(st.booleans()),
        cordoned=draw(st.booleans()),
    )


@st.composite
def servers(draw: st.DrawFn) -> Server:
    name = draw(names)
    return Server(
        name=ServerName(name),
        endpoint=draw(st.none() | st.just(f"127.0.0.1:{draw(st.integers(1, 65535))}")),
        port=draw(st.integers(1, 65535)),
        ready=draw(st.booleans()),
        reachable=draw(st.booleans()),
        usage_reported=draw(st.booleans()),
        busy=frozenset(draw(st.lists(uuids, max_size=3))),
        topology=tuple(sorted(draw(st.dictionaries(names, names, max_size=3)).items())),
        cards=tuple(draw(st.lists(cards(name), max_size=3))),
        error=draw(st.none() | st.text(max_size=20)),
        node=draw(st.none() | names.map(NodeName)),
        cordoned=draw(st.booleans()),
        cuda_version=draw(st.none() | st.sampled_from(["12.4", "11.8", "13.0.1", ""])),
    )


fleets = st.builds(
    Fleet, revision=small, observed_at=times, servers=st.lists(servers(), max_size=3).map(tuple)
)
pods = st.builds(PodRef, uid=names.map(PodUID), namespace=names, name=names)
card_ids = st.tuples(names, uuids).map(lambda t: CardId(f"{t[0]}/{t[1]}"))
assignments = st.builds(
    ContainerAssignment, name=names, cards=st.lists(card_ids, max_size=3).map(tuple)
)
requests = st.builds(
    ContainerRequest,
    name=names,
    kind=st.sampled_from(ContainerKind),
    count=st.integers(1, 8),
    memory_mib=small,
)
allocations = st.builds(
    Allocation,
    pod=pods,
    server=names.map(ServerName),
    endpoint=st.just("10.0.0.1:14833"),
    cards=st.lists(card_ids, max_size=4).map(tuple),
    containers=st.lists(assignments, max_size=3).map(tuple),
    state=st.sampled_from(ClaimState),
    booked_at=times,
    expires_at=st.none() | times,
    annotations=st.dictionaries(names, st.text(max_size=10), max_size=3).map(
        lambda d: tuple(sorted(d.items()))
    ),
)
claims = st.builds(
    Claim,
    pod=pods,
    server=names.map(ServerName),
    cards=st.lists(card_ids, max_size=4).map(tuple),
    containers=st.lists(assignments, max_size=3).map(tuple),
    state=st.sampled_from(ClaimState),
    booked_at=times,
    committed_at=st.none() | times,
    node=st.none() | names.map(NodeName),
    admission_ttl=st.none() | st.floats(min_value=0.001, max_value=1e6),
)
queues = st.builds(
    AdmissionQueue,
    pods=st.lists(
        st.builds(
            QueuedPod,
            pod=pods,
            position=small,
            priority=st.integers(-(2**31), 2**31 - 1),
            cards=small,
            reason=names,
            message=st.text(max_size=20),
            since=times,
        ),
        max_size=3,
    ).map(tuple),
    namespaces=st.lists(
        st.builds(
            NamespaceShare,
            namespace=names,
            held=small,
            quota=st.none() | small,
            weight=st.integers(1, 1000),
        ),
        max_size=3,
    ).map(tuple),
    config_problem=st.none() | st.text(max_size=20),
)
reason_counts = st.builds(ReasonCount, reason=st.sampled_from(Reason), count=small)
nofits = st.builds(
    NoFit,
    reasons=st.lists(reason_counts, max_size=4).map(tuple),
    total=small,
    servers=st.lists(
        st.builds(
            ServerVerdict,
            server=names.map(ServerName),
            reasons=st.lists(reason_counts, max_size=2).map(tuple),
            detail=st.text(max_size=10),
        ),
        max_size=2,
    ).map(tuple),
)


def _through_json(value: Any) -> Any:
    return json.loads(json.dumps(value.to_dict()))


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(fleets)
def test_fleet_roundtrips(fleet: Fleet) -> None:
    assert Fleet.from_dict(_through_json(fleet)) == fleet


@given(allocations)
def test_allocation_roundtrips(allocation: Allocation) -> None:
    assert Allocation.from_dict(_through_json(allocation)) == allocation


@given(queues)
def test_admission_queue_roundtrips(queue: AdmissionQueue) -> None:
    assert AdmissionQueue.from_dict(_through_json(queue)) == queue


def test_a_claim_without_an_admission_ttl_is_written_as_before() -> None:
    claim = Claim(
        pod=PodRef(uid=PodUID("u"), namespace="n", name="p"),
        server=ServerName("gpu-a"),
        cards=(),
        containers=(),
        state=ClaimState.BOOKED,
        booked_at=1.0,
    )
    assert "admissionTtlSeconds" not in claim.to_dict()
    assert not claim.admitted


@pytest.mark.parametrize("ttl", [0, -1, "60", True])
def test_an_admission_ttl_that_is_not_a_positive_number_is_refused(ttl: object) -> None:
    raw = {
        "pod": {"uid": "u", "namespace": "n", "name": "p"},
        "server": "gpu-a",
        "cards": [],
        "state": "booked",
        "bookedAt": 1.0,
        "admissionTtlSeconds": ttl,
    }
    with pytest.raises(ContractError) as caught:
        Claim.from_dict(raw)
    assert caught.value.path.endswith("admissionTtlSeconds")


@given(st.lists(claims, max_size=3), small)
def test_claim_set_roundtrips(items: list[Claim], revision: int) -> None:
    claim_set = ClaimSet(revision=revision, claims=tuple(items))
    assert ClaimSet.from_dict(_through_json(claim_set)) == claim_set


@given(
    pods,
    st.lists(requests, min_size=1, max_size=4),
    st.lists(names, max_size=3),
    st.booleans(),
    st.none() | st.integers(0, 999),
)
def test_allocation_request_roundtrips(
    pod: PodRef,
    containers: list[ContainerRequest],
    nodes: list[str],
    dry_run: bool,
    cuda_major: int | None,
) -> None:
    request = AllocationRequest(
        pod=pod,
        containers=tuple(containers),
        candidate_nodes=tuple(NodeName(n) for n in nodes),
        dry_run=dry_run,
        cuda_major=cuda_major,
    )
    assert AllocationRequest.from_dict(_through_json(request)) == request


@given(names)
def test_commit_request_roundtrips(node: str) -> None:
    request = CommitRequest(node=NodeName(node))
    assert CommitRequest.from_dict(_through_json(request)) == request


@given(nofits)
def test_nofit_roundtrips(nofit: NoFit) -> None:
    assert NoFit.from_dict(_through_json(nofit)) == nofit


entries = st.builds(DeviceEntry, card=card_ids, memory_mib=small, cores=st.integers(0, 100))


@given(st.lists(st.lists(entries, max_size=3), max_size=4))
def test_device_codec_roundtrips(containers: list[list[DeviceEntry]]) -> None:
    decoded = decode_devices(encode_devices(containers))
    assert decoded == tuple(tuple(c) for c in containers)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)

DECODERS: list[Callable[[object], object]] = [
    Fleet.from_dict,
    Server.from_dict,
    Card.from_dict,
    Topology.from_dict,
    AllocationRequest.from_dict,
    Allocation.from_dict,
    Claim.from_dict,
    ClaimSet.from_dict,
    AdmissionQueue.from_dict,
    FleetUpdate.from_dict,
    ClaimsUpdate.from_dict,
    CommitRequest.from_dict,
    NoFit.from_dict,
    ErrorBody.from_dict,
    ExtenderArgs.from_dict,
    ExtenderFilterResult.from_dict,
    ExtenderBindingArgs.from_dict,
    ExtenderBindingResult.from_dict,
    HostPriority.from_dict,
    AdmissionRequest.from_review,
]


@pytest.mark.parametrize("decode", DECODERS, ids=lambda d: getattr(d, "__qualname__", "?"))
@settings(deadline=None)
@given(value=json_values)
def test_from_dict_raises_only_contract_error(
    decode: Callable[[object], object], value: object
) -> None:
    try:
        decode(value)
    except ContractError:
        pass


@settings(deadline=None)
@given(st.text() | json_values.map(json.dumps))
def test_register_decoder_raises_only_contract_error(text: str) -> None:
    try:
        decode_register(text)
    except ContractError:
        pass


@settings(deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab/,:;0123456789RemoteGPU-")), max_size=40))
def test_device_decoder_raises_only_contract_error(text: str) -> None:
    try:
        decode_devices(text)
    except ContractError:
        pass
