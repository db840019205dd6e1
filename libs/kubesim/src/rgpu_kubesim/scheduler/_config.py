"""How the emulated kube-scheduler is configured, checked when it is built.

Every field mirrors a kube-scheduler or extender setting (``urlPrefix``, ``httpTimeout``,
``podInitialBackoffSeconds``, ``percentageOfNodesToScore``…) with kube's default, so a test or
the soak sets only what it changes; a value kube would refuse is a `SimOptionError` naming the
field, raised before anything starts.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import NoReturn

from rgpu_kubesim._lupine_errors import SimOptionError


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """How the emulated kube-scheduler behaves; defaults are kube-scheduler's."""

    extender_url: str
    """The extender's ``urlPrefix``; verbs are appended (``<url>/filter``)."""
    more_extender_urls: tuple[str, ...] = ()
    """Further replicas of the same extender; calls go round-robin over all of them, as
    through a Service that balances per request."""
    scheduler_name: str = "rgpu-scheduler"
    """Only pods whose ``spec.schedulerName`` is this are scheduled."""
    managed_resources: tuple[str, ...] = ("nvidia.com/remote-gpu", "nvidia.com/remote-gpu-memory")
    """The extender's ``managedResources``: it is called only for pods naming one (empty = all)."""
    http_timeout_seconds: float = 5.0
    """The extender's ``httpTimeout``: a call taking longer is an error (pod to backoffQ)."""
    initial_backoff_seconds: float = 1.0
    """``podInitialBackoffSeconds``: backoff after the first failed attempt."""
    max_backoff_seconds: float = 10.0
    """``podMaxBackoffSeconds``: the backoff doubles per attempt up to this."""
    unschedulable_flush_seconds: float = 300.0
    """Pods nothing moved back are retried after this long
    (``podMaxInUnschedulablePodsDuration``)."""
    pop_from_backoff: bool = False
    """The ``SchedulerPopFromBackoffQ`` feature gate: with nothing active, the next
    unschedulable pod in backoff is tried at once. Off, as in the kube-scheduler rgpu deploys
    (v1.31, ``k8s/base/scheduler``); on by default in kube-scheduler 1.33 and later."""
    backoff_window_seconds: float = 1.0
    """With ``pop_from_backoff``, backoff ends at the start of the window of this length after
    the one it expires in (kube's ``backoffQOrderingWindowDuration``, fixed at 1 s there;
    tests with short backoffs shorten it)."""
    prioritize_weight: int = 1
    """The extender's ``weight``; its 0-10 scores are multiplied by it (and by 10, as kube does)."""
    percentage_of_nodes_to_score: int = 0
    """Stop filtering once this share of nodes fit (0 = kube's adaptive rule; small clusters
    are always searched completely)."""
    seed: int = 0
    """Seeds the tie-break between equally scored nodes, so a run can be replayed."""
    trace: bool = False
    """Keep each pod's queue history in its record (``PodRecord.steps``), for ``rgpu soak
    --trace``. Off by default: a pod parked for long collects a step per cluster event."""
    extender_tls: ssl.SSLContext | None = None
    """The extender's ``tlsConfig``: the CA to verify it by and the client certificate to
    present (an https ``extender_url`` whose listener requires one)."""

    def __post_init__(self) -> None:
        for url in (self.extender_url, *self.more_extender_urls):
            if not url.startswith(("http://", "https://")):
                _invalid(
                    "extender_url",
                    f"{url!r} is not an http(s) URL, e.g. http://127.0.0.1:8083",
                )
        if not self.scheduler_name:
            _invalid("scheduler_name", "must not be empty (pods name it in spec.schedulerName)")
        for name in (
            "http_timeout_seconds",
            "initial_backoff_seconds",
            "backoff_window_seconds",
            "unschedulable_flush_seconds",
        ):
            if not getattr(self, name) > 0:
                _invalid(name, f"must be a positive number of seconds, got {getattr(self, name)!r}")
        if not self.max_backoff_seconds >= self.initial_backoff_seconds:
            _invalid(
                "max_backoff_seconds",
                f"{self.max_backoff_seconds!r} is below initial_backoff_seconds "
                f"{self.initial_backoff_seconds!r}",
            )
        if self.prioritize_weight < 1:
            _invalid("prioritize_weight", f"must be at least 1, got {self.prioritize_weight!r}")
        if not 0 <= self.percentage_of_nodes_to_score <= 100:
            _invalid(
                "percentage_of_nodes_to_score",
                f"must be 0 (adaptive) to 100, got {self.percentage_of_nodes_to_score!r}",
            )


def _invalid(field: str, reason: str) -> NoReturn:
    raise SimOptionError(field, reason)
