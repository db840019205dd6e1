"""The day-one alerts are valid Prometheus rules that fire when they should and only then.

``promtool check rules`` validates the PrometheusRule's groups; ``promtool test rules`` runs
the unit tests in ``tests/monitoring/alerts_test.yaml`` (input series, firing and quiet cases,
rendered annotations) against them. Every alert has a unit test of each kind and a runbook
section in ``docs/alerts.md``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RULE = ROOT / "k8s" / "components" / "observability" / "prometheusrule.yaml"
UNIT_TESTS = ROOT / "tests" / "monitoring" / "alerts_test.yaml"
RUNBOOK = ROOT / "docs" / "alerts.md"
RUNBOOK_URL = "https://github.com/rgpu/rgpu/blob/main/docs/alerts.md#"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: run `make setup` (installs Debian's prometheus package)")
    return path


def alerts() -> list[dict[str, Any]]:
    spec = yaml.safe_load(RULE.read_text())["spec"]
    return [rule for group in spec["groups"] for rule in group["rules"]]


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, check=False)


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    """The rule's groups as promtool reads them, beside the unit tests that name them."""
    spec = yaml.safe_load(RULE.read_text())["spec"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    return tmp_path


def test_alert_rules_pass_promtool_check(rules_dir: Path) -> None:
    result = run_promtool("check", "rules", str(rules_dir / "rules.yaml"))

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_alerts_fire_and_stay_quiet_as_their_unit_tests_expect(rules_dir: Path) -> None:
    result = run_promtool("test", "rules", str(rules_dir / UNIT_TESTS.name))

    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    cases = [
        case
        for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", ())
    ]
    firing = {c["alertname"] for c in cases if c["exp_alerts"]}
    quiet = {c["alertname"] for c in cases if not c["exp_alerts"]}
    names = {rule["alert"] for rule in alerts()}

    assert names - firing == set(), "alerts never shown firing"
    assert names - quiet == set(), "alerts never shown staying quiet"


def test_every_alert_links_its_runbook_section_and_says_how_bad_it_is() -> None:
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")
        for heading in re.findall(r"^## (.+)$", RUNBOOK.read_text(), flags=re.MULTILINE)
    }
    for rule in alerts():
        url = rule["annotations"]["runbook_url"]
        assert url == RUNBOOK_URL + rule["alert"].lower()
        assert url.removeprefix(RUNBOOK_URL) in anchors, f"no '## {rule['alert']}' in {RUNBOOK}"
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_the_webhook_alerts_name_the_webhook_the_apiserver_calls() -> None:
    """The apiserver labels its admission metrics with the webhook's name: a rename of the
    webhook would silence both alerts without this."""
    webhook = yaml.safe_load((ROOT / "k8s" / "base" / "extender" / "webhook.yaml").read_text())
    rules = yaml.safe_load(RULE.read_text())
    alerts = {r["alert"]: r["expr"] for g in rules["spec"]["groups"] for r in g["rules"]}
    names = "|".join(hook["name"] for hook in webhook["webhooks"])
    for name in ("RgpuWebhookErrors", "RgpuWebhookSlow"):
        assert f'name=~"{names}"' in alerts[name], name
