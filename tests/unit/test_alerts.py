"""The alerting rules llmgw ships (`llmgw alerts`, python/llmgw/alerts.yaml): valid for Prometheus,
naming only metrics llmgw exports, and firing on the series they are for (promtool's rule tests
in alerts_test.yaml)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from llmgw.cli import alerts as alerts_cli
from llmgw.cli.main import main
from llmgw.gateway import metrics as gateway_metrics

HERE = Path(__file__).resolve().parent
PACKAGE = Path(alerts_cli.__file__).resolve().parent.parent
# What defines llmgw's metric names: the gateway's table and collector, the control plane's
# registry and collectors.
METRIC_SOURCES = [PACKAGE / "gateway" / "metrics.py", PACKAGE / "control" / "metrics.py"]


def _promtool() -> str:
    found = (os.environ.get("LLMGW_PROMTOOL") or shutil.which("promtool")
             or str(Path.home() / ".cache" / "llmgw" / "tools" / "promtool"))
    if not os.access(found, os.X_OK):
        pytest.fail(f"promtool is not at {found}: `make tools` unpacks it from Debian's prometheus package "
                    "(or set LLMGW_PROMTOOL to one)")
    return found


def _exported() -> set[str]:
    """Every metric family name llmgw's metrics code defines, as Prometheus sees it."""
    names: set[str] = set(gateway_metrics.TABLE)
    for src in METRIC_SOURCES:
        names |= set(re.findall(r'"(llmgw_[a-z_]+)"', src.read_text()))
    # Counters made without the suffix get it from prometheus_client.
    return names | {n + "_total" for n in names if not n.endswith("_total")}


def _rules() -> list[dict[str, object]]:
    doc = yaml.safe_load(alerts_cli.rules())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_every_alert_names_metrics_llmgw_exports_and_says_what_to_do() -> None:
    exported = _exported()
    rules = _rules()
    assert len({r["alert"] for r in rules}) == len(rules) >= 10
    for r in rules:
        expr = str(r["expr"])
        used = set(re.findall(r"\b(llmgw_[a-z_]+)", expr))
        assert used, r["alert"]
        missing = {m for m in used if m.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
                   not in exported}
        assert not missing, f"{r['alert']} names metrics llmgw does not export: {missing}"
        labels, notes = r["labels"], r["annotations"]
        assert isinstance(labels, dict) and labels["severity"] in ("critical", "warning"), r["alert"]
        assert isinstance(notes, dict) and notes["summary"] and len(str(notes["description"])) > 60, r["alert"]


def test_a_renamed_metric_would_be_caught() -> None:
    # The check above compares against names found in the source: make sure it is not vacuous.
    exported = _exported()
    assert "llmgw_control_plane_leader" in exported and "llmgw_usage_records_dropped_total" in exported
    assert "llmgw_admin_requests_total" in exported and "llmgw_no_such_metric" not in exported


def _promtool_on(tmp_path: Path, rules: str, *args: str) -> subprocess.CompletedProcess[str]:
    """promtool ARGS in a folder holding `rules` as alerts.yaml and the rule tests beside it."""
    (tmp_path / "alerts.yaml").write_text(rules)
    shutil.copy(HERE / "alerts_test.yaml", tmp_path / "alerts_test.yaml")
    return subprocess.run([_promtool(), *args], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          check=False)


def test_promtool_accepts_the_rules_and_they_fire_as_their_tests_say(tmp_path: Path) -> None:
    check = _promtool_on(tmp_path, alerts_cli.rules(), "check", "rules", "alerts.yaml")
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in check.stdout
    tested = _promtool_on(tmp_path, alerts_cli.rules(), "test", "rules", "alerts_test.yaml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_promtool_fails_an_alert_that_does_not_fire(tmp_path: Path) -> None:
    # The rule tests can fail: with LlmgwNoLeader's `for` made ten minutes, the case that expects
    # it firing at 3 minutes does not pass.
    leader = "sum(llmgw_control_plane_leader) == 0\n        for: "
    slow = alerts_cli.rules().replace(leader + "1m", leader + "10m", 1)
    assert slow != alerts_cli.rules()
    tested = _promtool_on(tmp_path, slow, "test", "rules", "alerts_test.yaml")
    assert tested.returncode != 0 and "LlmgwNoLeader" in tested.stdout + tested.stderr


def test_llmgw_alerts_prints_the_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["alerts"]) == 0
    assert capsys.readouterr().out == alerts_cli.rules()
