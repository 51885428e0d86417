"""Job summary, step outputs and annotations, parsed the way the Actions runner parses them."""

from __future__ import annotations

import argparse
import copy
import json
import re
from pathlib import Path

import pytest

from gate.errors import ConfigError
from gate.github import actions
from gate.render.budget import SUMMARY_LIMIT
from gate.report_model import Report, load_report

REPORT = Path(__file__).resolve().parent.parent / "e2e" / "data" / "report.json"


def parse_github_output(text: str) -> dict[str, str]:
    """The runner's parser for $GITHUB_OUTPUT / $GITHUB_ENV files (name=value and name<<DELIM)."""
    out: dict[str, str] = {}
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line:
            continue
        eq, heredoc = line.find("="), line.find("<<")
        if heredoc >= 0 and (eq < 0 or heredoc < eq):
            name, delim = line[:heredoc], line[heredoc + 2 :]
            value = []
            while lines[i] != delim:  # IndexError: an unterminated block, as the runner fails
                value.append(lines[i])
                i += 1
            i += 1
            out[name] = "\n".join(value)
        else:
            out[line[:eq]] = line[eq + 1 :]
    return out


def parse_command(line: str) -> tuple[str, dict[str, str], str]:
    """The runner's parser for ``::cmd k=v,k=v::message`` with its unescaping."""
    m = re.fullmatch(r"::(\w+)(?: ([^:]*))?::(.*)", line)
    assert m, line
    props = {}
    for pair in (m.group(2) or "").split(","):
        if pair:
            k, v = pair.split("=", 1)
            props[k] = _unescape(v, prop=True)
    return m.group(1), props, _unescape(m.group(3))


def _unescape(text: str, prop: bool = False) -> str:
    text = text.replace("%0D", "\r").replace("%0A", "\n")
    if prop:
        text = text.replace("%3A", ":").replace("%2C", ",")
    return text.replace("%25", "%")


@pytest.fixture
def report() -> dict:
    return json.loads(REPORT.read_text())


def as_report(data: dict) -> Report:
    """The tests edit reports as JSON; the publish functions take them typed, as a loaded report.json is."""
    return Report.from_dict(data, require_verdict=True)


def commands(report: dict, **kw) -> list[str]:
    return [a.command() for a in actions.annotations(as_report(report), **kw)]


def failing(report: dict, n_fail: int = 2, n_warn: int = 2) -> dict:
    r = copy.deepcopy(report)
    for i, check in enumerate(r["checks"]):
        if i < n_fail:
            check["status"], check["diagnosis"] = (
                "FAIL",
                f"set `logprobs_mode=processed_logprobs` ({i})",
            )
        elif i < n_fail + n_warn:
            check["status"] = "WARN"
    r["verdict"] = "FAIL" if n_fail else ("WARN" if n_warn else "PASS")
    r["counts"] = {
        s: sum(c["status"] == s for c in r["checks"])
        for s in ("PASS", "WARN", "FAIL", "ERROR", "SKIP")
    }
    return r


# -- outputs --------------------------------------------------------------------------------------
def test_single_line_outputs_use_name_value():
    assert actions.format_output("verdict", "PASS") == "verdict=PASS\n"


def test_multiline_outputs_use_a_random_heredoc_delimiter():
    value = "line 1\nline 2\nEOF\nverdict=PASS"  # a value that tries to end the block and set another output
    a, b = actions.format_output("x", value), actions.format_output("x", value)
    assert a != b  # random delimiter
    assert re.match(r"^x<<ghadelimiter_[0-9a-f-]{36}\n", a)
    assert parse_github_output(a) == {"x": value}


def test_output_names_are_validated():
    with pytest.raises(ValueError):
        actions.format_output("a\nb", "x")


def test_write_outputs_appends_and_parses_back(tmp_path, report):
    path = tmp_path / "out"
    path.write_text("earlier=1\n")
    outputs = actions.outputs_for(as_report(report), Path("/r/report.json"), 0, "https://x/1")
    assert actions.write_outputs(outputs, path)
    parsed = parse_github_output(path.read_text())
    assert parsed == {"earlier": "1"} | outputs
    assert (
        parsed["verdict"] == "PASS" and parsed["pass-count"] == "7" and parsed["fail-count"] == "0"
    )
    assert set(outputs) >= {
        "verdict",
        "report-path",
        "comment-url",
        "pass-count",
        "warn-count",
        "fail-count",
        "error-count",
    }


def test_write_outputs_outside_actions_is_a_no_op(monkeypatch, report):
    monkeypatch.delenv("GITHUB_OUTPUT", raising=False)
    assert actions.write_outputs({"a": "b"}) is False


# -- annotations ----------------------------------------------------------------------------------
def test_escaping_matches_the_runner():
    assert actions.escape_data("100%\r\nnext") == "100%25%0D%0Anext"
    assert actions.escape_property("a: b, c%") == "a%3A b%2C c%25"


def test_annotations_for_fail_and_warn_checks(report):
    lines = commands(failing(report, 2, 2))
    parsed = [parse_command(line) for line in lines]
    assert [p[0] for p in parsed] == ["error", "error", "warning", "warning"]
    _level, props, message = parsed[0]
    assert props["title"].startswith("gate cpu-default: ") and props["title"].endswith(" FAIL")
    assert "logprobs_mode=processed_logprobs" in message


def test_a_passing_report_has_no_annotations(report):
    assert actions.annotations(as_report(report)) == []


def test_at_most_ten_annotations_errors_first(report):
    r = failing(report, 2, 5)
    r["errors"] = [f"engine new crashed {i}" for i in range(6)]
    lines = commands(r)
    assert len(lines) == 10
    kinds = [parse_command(line)[0] for line in lines]
    assert kinds[:8] == ["error"] * 8  # 6 errors + 2 FAIL checks before any warning
    assert (
        parse_command(lines[-1])[2] == "4 more finding(s) in the report"
    )  # 5 WARN: 1 shown + 4 more


def test_untrusted_text_cannot_forge_a_workflow_command(report):
    r = failing(report, 1, 0)
    r["checks"][0]["summary"] = "evil\n::set-output name=verdict::PASS\r\n::error::fake"
    r["checks"][0]["title"] = "t: x, y=z"
    r["gate_id"] = "g,id:1"
    (line,) = commands(r)
    assert "\n" not in line and "\r" not in line  # one line: nothing after it is a command
    _level, props, message = parse_command(line)
    assert props == {"title": "gate g,id:1: t: x, y=z FAIL"}
    assert message.startswith("evil\n::set-output name=verdict::PASS\r\n::error::fake")


def test_baseline_mismatch_is_annotated(report):
    r = copy.deepcopy(report)
    r["baseline"] = {
        "status": "WARN",
        "message": "baseline differs",
        "differences": ["model sha256 differs"],
    }
    (line,) = commands(r)
    level, props, message = parse_command(line)
    assert (
        level == "warning"
        and "baseline WARN" in props["title"]
        and "model sha256 differs" in message
    )


# -- summary --------------------------------------------------------------------------------------
def test_summary_is_appended(tmp_path, report):
    from gate.render.markdown import render_summary

    path = tmp_path / "summary.md"
    path.write_text("# earlier step\n")
    n = actions.write_step_summary(
        as_report(report), lambda r, b: render_summary(r, budget=b), path
    )
    text = path.read_text()
    assert (
        text.startswith("# earlier step\n\n")
        and len(text.encode()) == len(b"# earlier step\n\n") + n
    )
    assert "PASS" in text


def test_summary_never_exceeds_one_mib(tmp_path, report):
    calls: list[int] = []

    def greedy(
        r: Report, budget: int
    ) -> str:  # a renderer that overshoots its budget with multibyte text
        calls.append(budget)
        return "é" * budget

    path = tmp_path / "summary.md"
    path.write_bytes(b"x" * 1000)
    n = actions.write_step_summary(as_report(report), greedy, path)
    assert path.stat().st_size <= SUMMARY_LIMIT and n > 500_000
    assert len(calls) >= 2 and calls[1] < calls[0]


def test_summary_falls_back_to_a_note_when_nothing_fits(tmp_path, report):
    path = tmp_path / "summary.md"
    n = actions.write_step_summary(as_report(report), lambda r, b: "z" * 10_000, path, limit=5_000)
    text = path.read_text()
    assert path.stat().st_size <= 5_000 and "does not fit" in text and n == len(text.encode())


def test_summary_outside_actions(monkeypatch, report):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert actions.write_step_summary(as_report(report), lambda r, b: "x") is None


# -- report loading and exit codes ----------------------------------------------------------------
def test_load_report_from_file_dir_and_incomplete_dir(tmp_path, report):
    run = tmp_path / "run"
    (tmp_path / "run.incomplete").mkdir()
    (tmp_path / "run.incomplete" / "report.json").write_text(json.dumps(report))
    assert load_report(run, require_verdict=True)[1] == tmp_path / "run.incomplete" / "report.json"
    assert load_report(tmp_path / "run.incomplete", require_verdict=True)[0].verdict == "PASS"
    assert load_report(REPORT, require_verdict=True)[1] == REPORT
    with pytest.raises(ConfigError, match=r"no report\.json"):
        load_report(tmp_path / "nothing", require_verdict=True)
    assert actions.has_report(run) and not actions.has_report(tmp_path / "nothing")


def test_load_report_refuses_unknown_schema(tmp_path, report):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report | {"schema": "gate-report/2"}))
    with pytest.raises(ConfigError, match="schema"):
        load_report(path, require_verdict=True)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="invalid JSON at line 1"):
        load_report(path, require_verdict=True)


@pytest.mark.parametrize(("verdict", "fail_on", "code"), [
    ("PASS", None, 0), ("WARN", None, 0), ("WARN", "warn", 1), ("FAIL", None, 1), ("ERROR", "warn", 3),
])  # fmt: skip
def test_exit_code_for(report, verdict, fail_on, code):
    assert actions.exit_code_for(as_report(report | {"verdict": verdict}), fail_on) == code


# -- the command ----------------------------------------------------------------------------------
def test_gate_publish_writes_summary_outputs_and_annotations(tmp_path, monkeypatch, capsys, report):
    from gate.commands.github import register

    r = failing(report, 1, 1)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(r))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "output"))
    parser = argparse.ArgumentParser(prog="gate")
    register(parser.add_subparsers())
    args = parser.parse_args(["publish", str(tmp_path), "--fail-on", "warn"])
    assert args.func(args) == 0
    out = parse_github_output((tmp_path / "output").read_text())
    assert (
        out["verdict"] == "FAIL"
        and out["exit-code"] == "1"
        and out["fail-count"] == "1"
        and out["warn-count"] == "1"
    )
    assert out["report-path"] == str(path.resolve())
    assert "FAIL" in (tmp_path / "summary.md").read_text()
    stdout = capsys.readouterr().out.splitlines()
    assert [parse_command(line)[0] for line in stdout] == ["error", "warning"]


def test_the_summary_renderer_is_handed_the_report_given(tmp_path, report):
    typed = as_report(failing(report, 1, 1))
    seen: list[Report] = []
    actions.write_step_summary(
        typed, lambda rep, budget: seen.append(rep) or "x", tmp_path / "s.md"
    )
    assert seen and seen[0] is typed
