"""The scaling checks of ``rgpu soak`` on synthetic evidence: each passes on replicas that
divide the work and fails on the repetition it exists to catch — servers probed once per
replica, replicas serving different fleets under one revision, two metrics replicas exporting
the same card, every allocator replica sweeping the same stale claim."""

from __future__ import annotations

from rgpu_sim.soak_scaling import (
    FleetSample,
    SeriesSample,
    WriteWindow,
    card_series,
    check_background_writes,
    check_identical_fleets,
    check_probes_per_interval,
    check_single_series,
    fleet_digest,
)

SERVERS = ("gpu-a", "gpu-b", "gpu-c")


# --- probes ---------------------------------------------------------------------------------


def test_probes_once_per_interval_in_total_pass_and_report_the_figures() -> None:
    result = check_probes_per_interval(dict.fromkeys(SERVERS, 10), 10.0, 1.0, 3)
    assert result.passed
    assert "min 1.00, median 1.00, max 1.00 over 3 servers" in result.name


def test_every_replica_probing_every_server_fails_naming_the_servers() -> None:
    result = check_probes_per_interval(dict.fromkeys(SERVERS, 30), 10.0, 1.0, 3)
    assert not result.passed
    assert "gpu-a: 3.00" in result.detail


def test_a_server_left_unprobed_fails() -> None:
    result = check_probes_per_interval({"gpu-a": 10, "gpu-b": 0}, 10.0, 1.0, 2)
    assert not result.passed
    assert "gpu-b: 0.00" in result.detail


def test_a_few_on_demand_probes_and_cut_intervals_are_tolerated() -> None:
    assert check_probes_per_interval({"gpu-a": 12, "gpu-b": 9}, 10.0, 1.0, 2).passed


def test_no_servers_measured_fails() -> None:
    assert not check_probes_per_interval({}, 10.0, 1.0, 2).passed


# --- fleets ---------------------------------------------------------------------------------


def fleet(round_: int, replica: str, revision: int, content: str) -> FleetSample:
    return FleetSample(round=round_, replica=replica, revision=revision, digest=content)


def test_replicas_serving_one_revision_sequence_pass() -> None:
    samples = [
        fleet(0, "discovery-1", 5, "x"),
        fleet(0, "discovery-2", 4, "w"),  # lagging a revision behind is no disagreement
        fleet(1, "discovery-1", 6, "y"),
        fleet(1, "discovery-2", 6, "y"),
    ]
    result = check_identical_fleets(samples)
    assert result.passed, result.detail
    assert "2 rounds, 3 revisions, 0 split" in result.name


def test_one_revision_with_two_contents_fails() -> None:
    samples = [fleet(0, "discovery-1", 5, "busy"), fleet(0, "discovery-2", 5, "free")]
    result = check_identical_fleets(samples)
    assert not result.passed
    assert "revision 5 had 2 different contents" in result.detail


def test_replicas_that_never_agree_at_the_end_fail() -> None:
    samples = [
        sample
        for n in range(5)
        for sample in (fleet(n, "discovery-1", 10 + n, "a"), fleet(n, "discovery-2", 20 + n, "b"))
    ]
    result = check_identical_fleets(samples)
    assert not result.passed
    assert "the last 3 rounds each saw different fleets" in result.detail


def test_one_round_straddling_a_change_at_the_end_is_no_disagreement() -> None:
    samples = [
        fleet(0, "discovery-1", 7, "a"),
        fleet(0, "discovery-2", 7, "a"),
        fleet(1, "discovery-1", 8, "b"),
        fleet(1, "discovery-2", 7, "a"),
    ]
    assert check_identical_fleets(samples).passed


def test_the_digest_ignores_the_revision_and_build_time_but_not_the_content() -> None:
    one = {"revision": 1, "observedAt": 10.0, "servers": [{"name": "gpu-a", "busy": []}]}
    assert fleet_digest(one) == fleet_digest({**one, "revision": 2, "observedAt": 11.5})
    assert fleet_digest(one) != fleet_digest({"revision": 1, "servers": []})


# --- card series ----------------------------------------------------------------------------

SCRAPE = """# HELP hami_remote_gpu_allocated x
# TYPE hami_remote_gpu_allocated gauge
hami_remote_gpu_allocated{server="gpu-a",device_uuid="gpu-a/GPU-0"} 1
rgpu_card_state{card="gpu-a/GPU-0",state="bound"} 1
rgpu_server_up{server="gpu-a"} 1
rgpu_source_up{source="discovery"} 1
process_cpu_seconds_total 0.5
"""


def test_card_series_are_the_card_families_only() -> None:
    assert card_series(SCRAPE) == {
        'hami_remote_gpu_allocated{server="gpu-a",device_uuid="gpu-a/GPU-0"}',
        'rgpu_card_state{card="gpu-a/GPU-0",state="bound"}',
        'rgpu_server_up{server="gpu-a"}',
    }


def series(round_: int, replica: str, text: str) -> SeriesSample:
    return SeriesSample(round=round_, replica=replica, series=card_series(text))


def test_one_exporter_among_replicas_passes() -> None:
    samples = [series(0, "metrics-1", SCRAPE), series(0, "metrics-2", "rgpu_leader 0\n")]
    result = check_single_series(samples)
    assert result.passed, result.detail
    assert "0 duplicates" in result.name


def test_two_replicas_exporting_the_same_card_fail() -> None:
    samples = [series(0, "metrics-1", SCRAPE), series(0, "metrics-2", SCRAPE)]
    result = check_single_series(samples)
    assert not result.passed
    assert "from metrics-1 and metrics-2" in result.detail
    assert "none of the last 1 rounds had one exporting replica" in result.detail


def test_a_handover_between_rounds_is_no_duplicate() -> None:
    samples = [
        series(0, "metrics-1", SCRAPE),
        series(0, "metrics-2", ""),
        series(1, "metrics-1", ""),
        series(1, "metrics-2", SCRAPE),
    ]
    assert check_single_series(samples).passed


def test_nobody_exporting_at_the_end_fails() -> None:
    samples = [series(0, "metrics-1", ""), series(0, "metrics-2", "")]
    result = check_single_series(samples)
    assert not result.passed
    assert "had one exporting replica: []" in result.detail


# --- background writes ----------------------------------------------------------------------


def test_one_write_per_stale_claim_passes_and_reports_the_rates() -> None:
    window = WriteWindow(seconds=5.0, at_rest=5, sweeping=13, planted=8, swept=8)
    result = check_background_writes(window, 3)
    assert result.passed, result.detail
    assert "1.00/s at rest, 1.00 per stale claim, 8/8 swept" in result.name


def test_every_replica_sweeping_the_same_claims_fails() -> None:
    # Three replicas: the winner's write plus two refused compare-and-swaps per claim.
    window = WriteWindow(seconds=5.0, at_rest=5, sweeping=5 + 3 * 8, planted=8, swept=8)
    result = check_background_writes(window, 3)
    assert not result.passed
    assert "24 writes for 8 stale claims" in result.detail


def test_a_stale_claim_nobody_swept_fails() -> None:
    window = WriteWindow(seconds=5.0, at_rest=5, sweeping=10, planted=8, swept=5)
    result = check_background_writes(window, 1)
    assert not result.passed
    assert "3 stale claims never swept" in result.detail


def test_no_window_measured_fails() -> None:
    assert not check_background_writes(None, 2).passed
