"""A soak's length is arithmetic, not a guess: its pods ask for so many server-seconds (or
card-seconds, per card) and the fleet offers so many per second, so a stream that asks for more
than the fleet can give grows a queue without end, and a fixed deadline cuts a long run in the
middle and judges the pods it never reached. So the stream follows the fleet — it arrives no
faster than the rate at which it asks for ``load`` of the fleet (80 % by default) — and the
deadline follows the stream. What cannot finish is said before anything starts, with the
figures: a pod no server of the fleet can take, a quota or gang that can never be admitted,
a deadline set shorter than the work.

Pacing keeps every pod's shape: the planned arrivals are one seeded exponential draw per pod
scaled by the mean gap, so a slower stream is the same pods arriving later.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .soak_workload import SoakPod, WorkloadShape, plan_soak_workload

__all__ = [
    "HOLD_OVERHEAD_SECONDS",
    "LOAD",
    "Sizing",
    "fleet_problems",
    "pace",
    "size",
]

LOAD = 0.8
"""The share of the fleet the stream asks for by default: below 1, so the queue stays bounded
and every pod runs, high enough that pods wait for capacity and wake-ups are exercised."""
HOLD_OVERHEAD_SECONDS = 0.6
"""Seconds a pod holds its server (cards) beyond its run time: booking, the gate, the scheduler,
the kubelet's start and the release after it ends. Measured on 5,000-pod soaks (docs/sizing.md):
8 servers carried 3.9 pods/s at a mean run of 1.5 s, about 2.1 server-seconds per pod."""
DEADLINE_FACTOR = 2.0
"""The deadline is this many times the work's own length: a busy 2-core machine runs the
stack slower than a quiet one, and a deadline is a guard against a hang, not a target."""
DEADLINE_SLACK_SECONDS = 300.0
"""Added to the deadline: start-up, the drain, the faults' tail."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sizing:
    """The arithmetic of one soak: what its stream asks of its fleet, and how long it takes."""

    pods: int
    units: int
    """Servers, or cards with ``--granularity card``: what a pod holds."""
    unit: str
    work_seconds: float
    """Unit-seconds the pods hold, run time plus ``HOLD_OVERHEAD_SECONDS`` each."""
    arrival_seconds: float
    """When the last pod arrives."""
    gap_seconds: float
    """The stream's mean gap between pods."""
    timeout_seconds: float | None = None
    """A deadline the operator set; ``None`` derives it."""

    @property
    def load(self) -> float:
        """The share of the fleet the stream asks for while it arrives."""
        if self.arrival_seconds <= 0:
            return float("inf") if self.work_seconds else 0.0
        return self.work_seconds / (self.units * self.arrival_seconds)

    @property
    def need_seconds(self) -> float:
        """The shortest the run can take: the stream's length, or the work spread over every
        unit of the fleet, whichever is longer."""
        return max(self.arrival_seconds, self.work_seconds / self.units)

    @property
    def deadline_seconds(self) -> float:
        if self.timeout_seconds is not None:
            return self.timeout_seconds
        return self.need_seconds * DEADLINE_FACTOR + DEADLINE_SLACK_SECONDS

    def describe(self) -> str:
        """The arithmetic in one line, as the soak prints it before it starts."""
        rate = 1 / self.gap_seconds if self.gap_seconds else float("inf")
        return (
            f"{self.pods} pods at {rate:.2f}/s arrive over {self.arrival_seconds:.0f}s and hold "
            f"{self.work_seconds:.0f} {self.unit}-seconds ({self.load:.0%} of {self.units} "
            f"{self.unit}s); the work takes at least {self.need_seconds:.0f}s, deadline "
            f"{self.deadline_seconds:.0f}s"
        )

    def problem(self) -> str | None:
        """Why the run cannot finish by its deadline; ``None`` when it can."""
        if self.timeout_seconds is None or self.timeout_seconds >= self.need_seconds:
            return None
        return (
            f"--timeout-seconds {self.timeout_seconds:g} is shorter than the work, which takes "
            f"at least {self.need_seconds:.0f}s: give it that, fewer pods or a larger fleet"
        )


Servers = Sequence[Sequence[int]]
"""The fleet as sizing reads it: per server, the memory (MiB) of each healthy card."""


def units_of(pod: SoakPod, granularity: str) -> int:
    """What ``pod`` holds: one server, or its cards as card granularity counts them (the
    init container's cards, or every app container's, whichever is more)."""
    if granularity == "server":
        return 1
    return max(pod.init_cards, sum(cards for _, cards, _ in pod.containers))


def capacity(servers: Servers, granularity: str) -> int:
    """Units the fleet offers: servers with a healthy card, or healthy cards."""
    if granularity == "server":
        return sum(1 for cards in servers if cards)
    return sum(len(cards) for cards in servers)


def size(
    plans: Sequence[SoakPod],
    *,
    servers: Servers,
    granularity: str,
    gap_seconds: float,
    timeout_seconds: float | None = None,
) -> Sizing:
    """The arithmetic of ``plans`` on ``servers``."""
    work = sum(units_of(p, granularity) * (p.run_seconds + HOLD_OVERHEAD_SECONDS) for p in plans)
    return Sizing(
        pods=len(plans),
        units=max(1, capacity(servers, granularity)),
        unit=granularity,
        work_seconds=work,
        arrival_seconds=max((p.arrival_seconds for p in plans), default=0.0),
        gap_seconds=gap_seconds,
        timeout_seconds=timeout_seconds,
    )


def pace(
    shape: WorkloadShape, *, servers: Servers, granularity: str, load: float = LOAD
) -> WorkloadShape:
    """``shape`` with its mean gap widened, if need be, so its stream asks for at most ``load``
    of the fleet (never narrowed: the shape's own rate is what the machine carries)."""
    plans = plan_soak_workload(shape)
    if load <= 0 or not plans:
        return shape
    # Planned with the shape's gap: arrivals scale with the gap, so this stream's own span
    # (not its expected one) sets the gap that asks for ``load``.
    sized = size(plans, servers=servers, granularity=granularity, gap_seconds=1.0)
    span = sized.arrival_seconds / shape.mean_gap_seconds if shape.mean_gap_seconds else 0.0
    if span <= 0:
        return shape
    wanted = sized.work_seconds / (sized.units * load * span)
    if wanted <= shape.mean_gap_seconds:
        return shape
    return replace(shape, mean_gap_seconds=round(wanted, 4))


def _takes(cards: Sequence[int], pod: SoakPod, granularity: str) -> bool:
    """Whether a free server with healthy cards of ``cards`` MiB could take ``pod``: each
    container on its own (server granularity) or all at once (card granularity), as
    ``rgpu_placement`` fits them."""
    asks = [(n, m or 0) for _, n, m in pod.containers if n] + (
        [(pod.init_cards, 0)] if pod.init_cards else []
    )
    if granularity == "server":
        return all(sum(1 for c in cards if c >= m) >= n for n, m in asks)
    memory = max((m for _, m in asks), default=0)
    return sum(1 for c in cards if c >= memory) >= units_of(pod, "card")


def fleet_problems(plans: Sequence[SoakPod], *, servers: Servers, granularity: str) -> list[str]:
    """Pods no server of the fleet could ever take, even were every server free."""
    never = [p.key for p in plans if not any(_takes(c, p, granularity) for c in servers)]
    if not never:
        return []
    most = max((len(cards) for cards in servers), default=0)
    more = f" and {len(never) - 3} more" if len(never) > 3 else ""
    return [
        f"{len(never)} pods ask for more cards at once than any server has healthy ({most} at "
        f"most, granularity {granularity}): {', '.join(never[:3])}{more}; give --cards more"
    ]
