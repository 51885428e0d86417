"""report.json against its documented schema (docs/report.md): typed structs (gate.report_model), and wrong
types are one line naming file and field."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

import pytest

from gate.cli import main
from gate.errors import EXIT_USAGE, ConfigError
from gate.render.markdown import render_comment
from gate.report_model import Check, Report, ReportError, WorstToken, load_report

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "tests" / "e2e" / "data" / "report.json"


@pytest.fixture
def report() -> dict:
    return json.loads(REPORT.read_text())


def test_committed_reports_are_valid():
    for path in [REPORT, *sorted((ROOT / "docs" / "examples").glob("*.report.json"))]:
        report, file = load_report(path, require_verdict=True)
        assert file == path and isinstance(report, Report) and report.checks
        assert all(isinstance(c, Check) for c in report.checks)


BAD = [
    (lambda r: r["counts"].__setitem__("PASS", "7"), "counts.PASS", 'a string "7"'),
    (lambda r: r.__setitem__("checks", [1, 2]), "checks[0]", "a number 1"),
    (
        lambda r: r["checks"][1].__setitem__("measurements", {"a": 1}),
        "checks[1].measurements",
        "an object",
    ),
    (
        lambda r: r["checks"][0]["measurements"][0].__setitem__("warn", "0.1"),
        "checks[0].measurements[0].warn",
        "a string",
    ),
    (lambda r: r["checks"][2].__setitem__("status", "OK"), "checks[2].status", 'a string "OK"'),
    (lambda r: r.__setitem__("errors", "boom"), "errors", "a string"),
    (
        lambda r: r["engines"].__setitem__("new\n::error::x", 3),
        'engines["new\\n::error::x"]',
        "a number 3",
    ),
    (
        lambda r: r.__setitem__("verdict", "PASS\n::add-mask::x"),
        "verdict",
        'a string "PASS\\n::add-mask::x"',
    ),
    (
        lambda r: r["run"].__setitem__("prompt_sets", [{"name": 3}]),
        "run.prompt_sets[0].name",
        "a number 3",
    ),
    (
        lambda r: r.__setitem__("commands", {"reproduce": ["rm", "-rf"]}),
        "commands.reproduce",
        "a list",
    ),
    (lambda r: r.__setitem__("parts", [{"checks": "x"}]), "parts[0].checks", "a string"),
    (lambda r: r["checks"][0].pop("id"), "checks[0].id", "null"),
]


@pytest.mark.parametrize("load", [load_report, lambda p: load_report(p, require_verdict=True)])
@pytest.mark.parametrize(("mutate", "field", "got"), BAD)
def test_wrong_types_name_the_file_and_field(tmp_path, report, mutate, field, got, load):
    mutate(report)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    with pytest.raises(ReportError) as err:
        load(path)
    message = str(err.value)
    assert err.value.exit_code == EXIT_USAGE
    assert message.startswith(f"{path}: field {field}: expected ") and f"got {got}" in message, (
        message
    )
    assert "\n" not in message and "\r" not in message


def test_the_exact_message_for_a_wrong_count(report):
    report["counts"]["PASS"] = "7"
    with pytest.raises(ReportError) as err:
        Report.from_dict(report, "report.json")
    assert (
        str(err.value)
        == 'report.json: field counts.PASS: expected a non-negative integer, got a string "7"'
    )


@pytest.mark.parametrize(
    ("mutate", "message"),
    [(lambda r: r["counts"].__setitem__("BOGUS", 1), 'field counts.BOGUS: expected "PASS" or "WARN" or "FAIL" or "ERROR" or "SKIP", got a string "BOGUS"'),
     (lambda r: r["counts"].__setitem__("FAIL", -1), "field counts.FAIL: expected a non-negative integer, got a number -1"),
     (lambda r: r["engines"]["old"]["timings"].__setitem__("total_s", True), "field engines.old.timings.total_s: expected a number, got a boolean true"),
     (lambda r: r["checks"][0].__setitem__("status", None), "field checks[0].status: expected \"PASS\" or"),
     (lambda r: r.__setitem__("fail_on", "never"), 'field fail_on: expected "fail" or "warn", got a string "never"'),
     (lambda r: r["checks"][0]["details"].__setitem__("worst_tokens", [{"token": 3}]), "field checks[0].details.worst_tokens[0].token: expected a string, got a number 3"),
     (lambda r: r["checks"][4]["details"]["diff"].__setitem__("dtype", "x"), "field checks[4].details.diff.dtype: expected an object, got a string"),
     (lambda r: r["checks"][4]["details"].__setitem__("overridden_by_engine", {"dtype": []}), "field checks[4].details.overridden_by_engine.dtype: expected an object, got a list"),
     (lambda r: r["checks"][4]["details"].__setitem__("acknowledged", [1]), "field checks[4].details.acknowledged[0]: expected a string, got a number 1"),
     (lambda r: r["checks"][4]["details"].__setitem__("compared_with", {}), "field checks[4].details.compared_with: expected a string, got an object"),
     (lambda r: r["checks"][1]["details"].__setitem__("worst_tokens", [{"rank": "1"}]), 'field checks[1].details.worst_tokens[0].rank: expected an integer, got a string "1"'),
     (lambda r: r["checks"][1]["details"].__setitem__("worst_tokens", [{"context_after": 1}]), "field checks[1].details.worst_tokens[0].context_after: expected a string, got a number 1"),
     (lambda r: r["baseline"]["manifest"].__setitem__("created", 20261129), "field baseline.manifest.created: expected a string, got a number 20261129"),
     (lambda r: r["baseline"]["manifest"]["recorded_from"].__setitem__("spec", ["vllm"]), "field baseline.manifest.recorded_from.spec: expected a string, got a list"),
     (lambda r: r["baseline"]["manifest"]["engine"].__setitem__("identity", "cpu"), 'field baseline.manifest.engine.identity: expected an object, got a string "cpu"'),
     (lambda r: r["baseline"]["manifest"].__setitem__("model", {"sha256": 1}), "field baseline.manifest.model.sha256: expected a string, got a number 1"),
     (lambda r: r["baseline"]["manifest"].__setitem__("prompt_sets", [{"records": "64"}]), 'field baseline.manifest.prompt_sets[0].records: expected an integer, got a string "64"'),
     (lambda r: r.__setitem__("grpo", {"metrics": {"kl": {"new": [0.1, "x"]}}}), 'field grpo.metrics.kl.new[1]: expected a number, got a string "x"')],
)  # fmt: skip
def test_nested_fields_are_named_in_full(report, mutate, message):
    report["checks"][4]["details"]["diff"] = {"dtype": {"old": "bfloat16", "new": "float16"}}
    mutate(report)
    with pytest.raises(ReportError) as err:
        Report.from_dict(report, "r.json")
    assert str(err.value).startswith(f"r.json: {message}"), str(err.value)


@pytest.mark.parametrize("command", ["publish", "comment"])
def test_the_cli_exits_2_with_one_line(tmp_path, report, command, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    report["counts"]["PASS"] = "7"
    (tmp_path / "report.json").write_text(json.dumps(report))
    assert main([command, str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "field counts.PASS" in err[0], err


def test_a_report_not_read_from_a_file_is_named_report(report):
    bad = copy.deepcopy(report)
    bad["checks"][0]["summary"] = {"x": 1}
    with pytest.raises(
        ReportError, match=r"^report: field checks\[0\]\.summary: expected a string, got an object$"
    ):
        Report.from_dict(bad)


def test_unknown_keys_and_nulls_are_accepted(report):
    report["future_field"] = {"anything": [1]}
    report["checks"][0]["new_key"] = 1
    report["baseline"] = None
    report["engines"]["new"]["error"] = None
    report["errors"] = None
    report["checks"][1]["measurements"] = None
    typed = Report.from_dict(report)
    assert typed.baseline is None and typed.engines["new"].error is None
    assert (
        typed.errors == () and typed.checks[1].measurements == ()
    )  # null: not known, read as empty
    # what the structs do not interpret stays in the document, for merge to pass through
    assert (
        typed.document["future_field"] == {"anything": [1]}
        and typed.checks[0].document["new_key"] == 1
    )


def test_numbers_keep_their_json_type(report):
    report["checks"][0]["measurements"][0].update(value=12345, warn=0.5)
    m = Report.from_dict(report).checks[0].measurements[0]
    assert m.value == 12345 and isinstance(m.value, int) and isinstance(m.warn, float)


def test_merged_reports_carry_typed_parts():
    merged = Report.from_dict(
        json.loads((ROOT / "docs" / "examples" / "merged.report.json").read_text())
    )
    assert merged.parts is not None and len(merged.parts) == 3
    assert [p.verdict for p in merged.parts] == ["PASS", "WARN", "FAIL"]
    assert all(c.part for c in merged.checks)


def test_worst_tokens_are_typed_with_their_context(report):
    token = {"engine": "new", "prompt_id": "p1", "context": "the cat", "token": " sat", "context_after": " on the",
             "engine_logprob": -0.1, "trainer_logprob": -2.5, "position": 7, "rank": 1, "future": True}  # fmt: skip
    report["checks"][1]["details"]["worst_tokens"] = [token]
    t = Report.from_dict(report).checks[1].details.worst_tokens[0]
    assert t == WorstToken(engine="new", prompt_id="p1", context="the cat", token=" sat", context_after=" on the",
                           engine_logprob=-0.1, trainer_logprob=-2.5, position=7, rank=1)  # fmt: skip


def test_verdict_is_required_at_load_time(tmp_path, report):
    del report["verdict"]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    with pytest.raises(
        ConfigError,
        match=f"^{re.escape(str(path))}: field verdict: required, one of PASS, WARN, FAIL, ERROR$",
    ):
        load_report(path, require_verdict=True)
    # rendering does not need one: the headline shows ERROR
    typed, _ = load_report(path)
    assert typed.verdict is None and "🛑 ERROR" in render_comment(typed).text


def test_unknown_schema_majors_are_refused(report):
    for schema, message in (
        ("gate-report/2", "unsupported report schema 'gate-report/2'"),
        ("other/1", "not a gate report"),
    ):
        with pytest.raises(ReportError, match=re.escape(message)):
            Report.from_dict(dict(report, schema=schema), "r.json")
    assert Report.from_dict(dict(report, schema="gate-report/1.7")).schema == "gate-report/1.7"


# -- paths in report.json: relative to the repository, never a runner path -------------------------


def test_report_paths_are_relative_to_the_repository(tmp_path, monkeypatch):
    from gate import report
    from gate.config import BUILTIN_CONFIG, load_config
    from gate.host import repository_root

    repo = tmp_path / "checkout"
    (repo / ".git").mkdir(parents=True)
    (repo / "ci").mkdir()
    config = repo / "ci" / "my gate.yaml"
    config.write_text(BUILTIN_CONFIG.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # the runner's working directory is not the checkout
    assert repository_root(config.parent) == repo.resolve()
    # Outside that checkout the report falls back to the working directory, unless tmp_path itself
    # lies in a checkout (CI keeps pytest's folders inside its clone): then that one.
    enclosing = repository_root(tmp_path)
    assert enclosing != repo.resolve()
    assert report._paths_root(str(tmp_path / "gate.yaml")) == (enclosing or tmp_path.resolve())
    assert report.shown_path(str(repo / "baselines" / "x"), repo.resolve()) == "baselines/x"
    assert report.shown_path("/opt/runner/_work/runs/r1", repo.resolve()) == "r1"  # only the name
    cfg = load_config(BUILTIN_CONFIG)
    assert report.commands(cfg) == {
        "reproduce": "gate run",
        "regenerate_baseline": "gate baseline update",
    }
    cfg = dataclasses.replace(cfg, source=str(config))
    assert report.commands(cfg) == {
        "reproduce": "gate run -c 'ci/my gate.yaml'",
        "regenerate_baseline": "gate baseline update -c 'ci/my gate.yaml'",
    }
