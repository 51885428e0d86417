"""report.json against its documented schema (docs/report.md): wrong types are one line naming file and field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gate.cli import main
from gate.errors import EXIT_USAGE, ConfigError
from gate.github import actions
from gate.render.markdown import render_comment
from gate.report_schema import ReportError, validate_report

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "tests" / "e2e" / "data" / "report.json"


@pytest.fixture
def report() -> dict:
    return json.loads(REPORT.read_text())


def test_committed_reports_are_valid():
    for path in [REPORT, *sorted((ROOT / "docs" / "examples").glob("*.report.json"))]:
        validate_report(json.loads(path.read_text()), str(path))


BAD = [
    (lambda r: r["counts"].__setitem__("PASS", "7"), "counts.PASS", 'a string "7"'),
    (lambda r: r.__setitem__("checks", [1, 2]), "checks[0]", "a number 1"),
    (lambda r: r["checks"][1].__setitem__("measurements", {"a": 1}), "checks[1].measurements", "an object"),
    (lambda r: r["checks"][0]["measurements"][0].__setitem__("warn", "0.1"), "checks[0].measurements[0].warn", "a string"),
    (lambda r: r["checks"][2].__setitem__("status", "OK"), "checks[2].status", 'a string "OK"'),
    (lambda r: r.__setitem__("errors", "boom"), "errors", "a string"),
    (lambda r: r["engines"].__setitem__("new\n::error::x", 3), 'engines["new\\n::error::x"]', "a number 3"),
    (lambda r: r.__setitem__("verdict", "PASS\n::add-mask::x"), "verdict", 'a string "PASS\\n::add-mask::x"'),
    (lambda r: r["run"].__setitem__("prompt_sets", [{"name": 3}]), "run.prompt_sets[0].name", "a number 3"),
    (lambda r: r.__setitem__("commands", {"reproduce": ["rm", "-rf"]}), "commands.reproduce", "a list"),
    (lambda r: r.__setitem__("parts", [{"checks": "x"}]), "parts[0].checks", "a string"),
    (lambda r: r["checks"][0].pop("id"), "checks[0].id", "null"),
]


@pytest.mark.parametrize(("mutate", "field", "got"), BAD)
def test_wrong_types_name_the_file_and_field(tmp_path, report, mutate, field, got):
    mutate(report)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    with pytest.raises(ReportError) as err:
        actions.load_report(path)
    message = str(err.value)
    assert err.value.exit_code == EXIT_USAGE
    assert message.startswith(f"{path}: field {field}: expected ") and f"got {got}" in message, message
    assert "\n" not in message and "\r" not in message


@pytest.mark.parametrize("command", ["publish", "comment"])
def test_the_cli_exits_2_with_one_line(tmp_path, report, command, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    report["counts"]["PASS"] = "7"
    (tmp_path / "report.json").write_text(json.dumps(report))
    assert main([command, str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "field counts.PASS" in err[0], err


def test_the_renderer_validates_too(report):
    bad = copy.deepcopy(report)
    bad["checks"][0]["summary"] = {"x": 1}
    with pytest.raises(ReportError, match=r"^report: field checks\[0\]\.summary: expected a string, got an object$"):
        render_comment(bad)


def test_unknown_keys_and_nulls_are_accepted(report):
    report["future_field"] = {"anything": [1]}
    report["checks"][0]["new_key"] = 1
    report["baseline"] = None
    report["engines"]["new"]["error"] = None
    validate_report(report)


def test_verdict_is_required_at_load_time(tmp_path, report):
    del report["verdict"]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    with pytest.raises(ConfigError, match="field verdict: required"):
        actions.load_report(path)
