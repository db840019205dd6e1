"""Who waits for capacity, in the order the nudger reaches them: the pods refused for lack of
remote GPUs (``Refused``, oldest first) and every pending pod of rgpu's scheduler
(``Waiting``, least recently nudged first), each bounded so a burst cannot grow them without
end.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from rgpu_contracts import PodRef, PodUID

__all__ = ["COOL_DOWN", "REMEMBERED", "WAITING", "Refused", "Waiting"]


REMEMBERED = 1000
"""Refused pods kept; beyond that the oldest are dropped (they still get the 5-minute flush)."""
COOL_DOWN = 1.0
"""Seconds before a waiting pod is nudged again: kube-scheduler retries a nudged pod within
about a second, and a second nudge before that retry would only repeat the first."""
WAITING = 100_000
"""Pending pods tracked for nudges; beyond that new ones wait for kube-scheduler's flush."""


class Refused:
    """Pods refused for lack of capacity, oldest first."""

    __slots__ = ("_limit", "_pods")

    def __init__(self, *, limit: int = REMEMBERED) -> None:
        self._pods: OrderedDict[PodUID, PodRef] = OrderedDict()
        self._limit = limit

    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, uid: object) -> bool:
        return uid in self._pods

    def remember(self, pod: PodRef, *, first: bool = False) -> None:
        """Note a refusal; a pod refused again keeps its place in line, unless ``first``: a
        pod held to a server freed for it (preemption) goes to the head, so the release of
        its victims' cards nudges it whatever the queue behind."""
        self._pods.setdefault(pod.uid, pod)
        while len(self._pods) > self._limit:
            self._pods.popitem(last=False)
        if first and pod.uid in self._pods:
            self._pods.move_to_end(pod.uid, last=False)

    def forget(self, uid: str) -> None:
        """The pod got a server or is gone."""
        self._pods.pop(PodUID(uid), None)

    def take(self, count: int) -> list[PodRef]:
        """Remove and return up to ``count`` of the oldest refused pods."""
        taken: list[PodRef] = []
        while self._pods and len(taken) < count:
            taken.append(self._pods.popitem(last=False)[1])
        return taken


class Waiting:
    """Pending, unbound pods of rgpu's scheduler, least recently nudged first."""

    __slots__ = ("_limit", "_nudged", "_pods")

    def __init__(self, *, limit: int = WAITING) -> None:
        self._pods: OrderedDict[PodUID, PodRef] = OrderedDict()
        self._nudged: dict[PodUID, float] = {}
        self._limit = limit

    def __len__(self) -> int:
        return len(self._pods)

    def track(self, pod: PodRef, waiting: bool) -> None:
        """Note whether ``pod`` waits for a server (pending, unbound, rgpu's scheduler)."""
        if not waiting:
            self._pods.pop(pod.uid, None)
            self._nudged.pop(pod.uid, None)
        elif pod.uid not in self._pods and len(self._pods) < self._limit:
            self._pods[pod.uid] = pod

    def take(
        self,
        count: int,
        now: float,
        skip: Callable[[PodUID], bool],
        first: frozenset[PodUID] = frozenset(),
    ) -> list[PodRef]:
        """Up to ``count`` pods not ``skip``ped: those in ``first`` (nominees: capacity freed
        for them is what they wait for, so no cool-down), then those not nudged in the last
        ``COOL_DOWN`` seconds, least recently nudged first; each moves to the back of the line."""
        taken = [self._pods[u] for u in first if u in self._pods and not skip(u)][:count]
        for uid, pod in tuple(self._pods.items()):
            if len(taken) >= count:
                break
            cooled = now - self._nudged.get(uid, -COOL_DOWN) >= COOL_DOWN
            if uid not in first and cooled and not skip(uid):
                taken.append(pod)
        for pod in taken:
            self.nudged(pod.uid, now)
        return taken

    def cooled_at(self, now: float, skip: Callable[[PodUID], bool]) -> float | None:
        """When the first pod not ``skip``ped may be nudged again (``now`` if one may
        already); ``None`` when nobody waits."""
        for uid in self._pods:
            if not skip(uid):
                return max(now, self._nudged.get(uid, now - COOL_DOWN) + COOL_DOWN)
        return None

    def nudged(self, uid: PodUID, now: float) -> None:
        """``uid`` was just nudged: to the back of the line."""
        if uid in self._pods:
            self._pods.move_to_end(uid)
            self._nudged[uid] = now
