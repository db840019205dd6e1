from __future__ import annotations

import pytest

from rgpu_discovery.lupine import ProbeOutcome, ProbeResult
from rgpu_discovery.probestate import ProbeState

BUSY = ProbeState(probed=True, usage_reported=True, busy=frozenset({"GPU-1"}))


def outcome(result: ProbeResult, *busy: str) -> ProbeOutcome:
    return ProbeOutcome(result=result, busy=frozenset(busy))


def test_never_probed_server_is_reachable_with_unknown_usage() -> None:
    state = ProbeState()
    assert (state.reachable, state.usage_reported, state.busy, state.probed) == (
        True,
        False,
        frozenset(),
        False,
    )


def test_usage_reply_replaces_busy_set() -> None:
    assert BUSY.after(outcome("usage", "GPU-2")).busy == {"GPU-2"}


def test_empty_usage_reply_clears_busy_set() -> None:
    state = BUSY.after(outcome("usage"))
    assert (state.busy, state.usage_reported) == (frozenset(), True)


def test_404_means_no_usage_reporting_but_reachable() -> None:
    state = BUSY.after(outcome("no_usage"))
    assert (state.reachable, state.usage_reported, state.busy) == (True, False, frozenset())


@pytest.mark.parametrize(
    "result", ["http_error", "bad_body", "h2_alive", "timeout", "refused", "unreachable"]
)
def test_anything_but_a_usage_reply_keeps_the_busy_set(result: ProbeResult) -> None:
    state = BUSY.after(outcome(result))
    assert (state.busy, state.usage_reported) == ({"GPU-1"}, True)


@pytest.mark.parametrize("result", ["timeout", "refused", "unreachable"])
def test_one_failed_probe_keeps_server_reachable(result: ProbeResult) -> None:
    assert BUSY.after(outcome(result)).reachable


def test_two_failed_probes_in_a_row_make_server_unreachable() -> None:
    state = BUSY.after(outcome("timeout")).after(outcome("refused"))
    assert not state.reachable
    assert not state.after(outcome("unreachable")).reachable


def test_an_answer_between_failures_resets_the_count() -> None:
    state = BUSY.after(outcome("timeout")).after(outcome("h2_alive")).after(outcome("timeout"))
    assert state.reachable


@pytest.mark.parametrize("result", ["usage", "no_usage", "http_error", "bad_body", "h2_alive"])
def test_any_answer_makes_an_unreachable_server_reachable(result: ProbeResult) -> None:
    down = BUSY.after(outcome("timeout")).after(outcome("timeout"))
    assert down.after(outcome(result)).reachable
