"""The demo's verdict must not trust rgpu's own bookkeeping. These checks
look only at what the emulated kubelet saw — which server each running pod actually talked to,
with which GPUs, and when — and at the pod's own annotations."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rgpu_contracts import ANNOTATION_ALLOCATED, ContractError, decode_devices, split_card_id
from rgpu_kubesim.kubelet import RunRecord

__all__ = ["CheckResult", "check_endpoints", "check_no_sharing"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    """One named check, whether it passed, and the evidence when it did not."""

    name: str
    passed: bool
    detail: str = ""


def _overlaps(intervals: list[tuple[float, float, str]]) -> list[str]:
    found = []
    latest_end, latest_who = float("-inf"), ""
    for start, end, who in sorted(intervals):
        if start < latest_end:
            found.append(f"{latest_who} and {who}")
        if end > latest_end:
            latest_end, latest_who = end, who
    return found


def check_no_sharing(records: Iterable[RunRecord], now: float, *, per_card: bool) -> CheckResult:
    """No two pods ran at once on one server, or on one card when ``per_card``."""
    by_unit: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for record in records:
        if not record.gpus:
            continue
        end = record.finished_at if record.finished_at is not None else now
        units = (
            [f"{record.endpoint}/{gpu}" for gpu in record.gpus] if per_card else [record.endpoint]
        )
        for unit in units:
            by_unit[unit].append((record.started_at, end, record.key))
    clashes = {
        unit: found for unit, intervals in by_unit.items() if (found := _overlaps(intervals))
    }
    detail = "; ".join(f"{unit}: {', '.join(pairs)}" for unit, pairs in sorted(clashes.items()))
    what = "card" if per_card else "server"
    return CheckResult(
        name=f"no two running pods shared a {what}", passed=not clashes, detail=detail
    )


def _claimed_server(record: RunRecord) -> str | None:
    try:
        containers = decode_devices(record.annotations.get(ANNOTATION_ALLOCATED, ""))
        cards = [entry.card for part in containers for entry in part]
        servers = {split_card_id(card)[0] for card in cards}
    except ContractError:
        return None
    return servers.pop() if len(servers) == 1 else None


def check_endpoints(records: Iterable[RunRecord], endpoints: Mapping[str, str]) -> CheckResult:
    """Every pod that ran with remote GPUs had ``LUPINE_SERVER`` = its claimed server's endpoint."""
    wrong = []
    for record in records:
        if not record.gpus and record.phase != "Failed":
            continue
        server = _claimed_server(record)
        expected = endpoints.get(server or "", "<no claim annotation>")
        if record.endpoint != expected:
            wrong.append(
                f"{record.key}: LUPINE_SERVER={record.endpoint!r}, claim says {expected!r}"
            )
    return CheckResult(
        name="every running pod's LUPINE_SERVER was its claim's endpoint",
        passed=not wrong,
        detail="; ".join(wrong[:5]),
    )
