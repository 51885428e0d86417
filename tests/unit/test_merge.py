"""gate merge: several report.json (one per model or matrix job) -> one verdict, one report, one comment."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import pytest

from gate.commands import report as render_cli
from gate.errors import EXIT_ERROR, EXIT_FAIL, EXIT_OK, ConfigError
from gate.merge import merge_reports, merged_gate_id
from gate.render.markdown import render_comment, render_full
from gate.report_model import Report

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def report(verdict: str, gate_id: str | None = None, fail_on: str = "fail") -> dict:
    base = {"PASS": "pass", "WARN": "warn", "FAIL": "fail"}.get(verdict, "pass")
    r = json.loads((EXAMPLES / f"{base}.report.json").read_text(encoding="utf-8"))
    r["gate_id"] = gate_id or f"model-{verdict.lower()}"
    r["fail_on"] = fail_on
    if verdict == "ERROR":
        r.update(verdict="ERROR", exit_code=EXIT_ERROR, checks=[], errors=["engine 'new': worker crashed"],
                 counts={s: 0 for s in ("PASS", "WARN", "FAIL", "ERROR", "SKIP")})  # fmt: skip
    return r


def as_report(data: dict) -> Report:
    """The tests edit reports as JSON; merge_reports takes them typed, as ``gate merge`` loads them."""
    return Report.from_dict(data)


def merge(*reports: dict) -> dict:
    """The merged document of JSON ``reports`` (a merged one included), in the order given."""
    return merge_reports([as_report(r) for r in reports])


@pytest.mark.parametrize(
    "verdicts, expected, code",
    [(["PASS"], "PASS", EXIT_OK), (["PASS", "PASS"], "PASS", EXIT_OK), (["PASS", "WARN"], "WARN", EXIT_OK),
     (["WARN", "FAIL", "PASS"], "FAIL", EXIT_FAIL), (["FAIL", "ERROR", "PASS"], "ERROR", EXIT_ERROR)],
)  # fmt: skip
def test_verdict_is_the_worst_part(verdicts, expected, code):
    merged = merge(*(report(v) for v in verdicts))
    assert merged["verdict"] == expected and merged["exit_code"] == code
    assert merged["schema"] == "gate-report/1"


def test_fail_on_warn_in_any_part_makes_a_warn_exit_1():
    merged = merge(report("PASS"), report("WARN", fail_on="warn"))
    assert (merged["verdict"], merged["fail_on"], merged["exit_code"]) == (
        "WARN",
        "warn",
        EXIT_FAIL,
    )
    assert merge(report("PASS"), report("WARN"))["exit_code"] == EXIT_OK


def test_counts_are_summed_and_parts_keep_everything_in_order():
    inputs = [report("PASS", "a"), report("WARN", "b"), report("FAIL", "c")]
    merged = merge(*inputs)
    # Each example skips determinism-parity (not measured on the CPU default).
    assert merged["counts"] == {"PASS": 11 + 10 + 8, "WARN": 1, "FAIL": 3, "ERROR": 0, "SKIP": 3}
    assert [p["gate_id"] for p in merged["parts"]] == ["a", "b", "c"]
    for part, original in zip(merged["parts"], inputs, strict=True):
        assert part == {k: v for k, v in original.items() if k != "schema"}
    assert len(merged["checks"]) == 36 and {c["part"] for c in merged["checks"]} == {"a", "b", "c"}
    assert merged["gate_id"] == "a+b+c"
    assert merged["run"]["started"] == min(i["run"]["started"] for i in inputs)  # the earliest
    assert merged["commands"]["reproduce"] == (  # identical commands once, in the input order
        "gate run\ngate run -c docs/examples/warn.gate.yaml\n"
        "gate run -c docs/examples/fail.gate.yaml"
    )


def test_errors_and_baseline_differences_name_their_part():
    err = report("ERROR", "gpu")
    warn = report("WARN", "cpu")
    warn["baseline"].update(status="WARN", differences=["device class differs"])
    merged = merge(warn, err)
    assert merged["errors"] == ["gpu: engine 'new': worker crashed"]
    assert merged["baseline"]["status"] == "WARN" and merged["baseline"]["differences"] == [
        "cpu: device class differs"
    ]


def test_inputs_are_not_modified_and_merges_flatten():
    a, b, c = report("PASS", "a"), report("WARN", "b"), report("FAIL", "c")
    before = copy.deepcopy([a, b, c])
    inner = merge(a, b)
    outer = merge(inner, c)
    assert [a, b, c] == before
    assert [p["gate_id"] for p in outer["parts"]] == ["a", "b", "c"]
    assert outer["verdict"] == "FAIL"


def test_gate_id_of_a_merge():
    assert merged_gate_id(["x", "x"]) == "x"
    assert merged_gate_id(["b", "a"]) == "a+b"
    long = merged_gate_id([f"model-{i:03d}-with-a-long-name" for i in range(10)])
    assert long.startswith("merged-10-") and len(long) < 40
    assert long == merged_gate_id([f"model-{i:03d}-with-a-long-name" for i in reversed(range(10))])


@pytest.mark.parametrize("bad", [{"schema": "gate-report/2"}, {"verdict": "PASS"}, []])
def test_unknown_schema_or_no_reports_is_a_config_error(bad):
    with pytest.raises(ConfigError):
        merge(report("PASS"), bad) if bad != [] else merge_reports([])


def test_merged_report_renders_a_section_per_part():
    merged = merge(report("PASS", "qwen-0.5b"), report("WARN", "llama-1b"), report("FAIL", "tiny"))
    out = render_comment(as_report(merged))
    text = out.text
    assert text.startswith(
        "<!-- gate-report:llama-1b+qwen-0.5b+tiny -->\n## ❌ FAIL: vLLM upgrade gate"
    )
    assert (
        "3 parts (1 failed, 1 warned, 1 passed); 36 checks: 3 failed, 1 warned, 29 passed, 3 skipped. "
        "Exit code 1." in text
    )
    for gid, icon, verdict in (
        ("qwen-0.5b", "✅", "PASS"),
        ("llama-1b", "⚠️", "WARN"),
        ("tiny", "❌", "FAIL"),
    ):
        assert (  # the per-model table, first
            f"| {icon} {verdict} | <code>{gid}</code> | <code>tiny-arith</code> | 0.31.0 → 0.32.0 |"
            in text[: text.index("### ")]
        )
        assert f"### {icon} {verdict}: part <code>{gid}</code>" in text  # the part's own section
    # worst first, in the parts table and in the sections; the merged JSON keeps the input order
    assert (
        text.index("| ❌ FAIL | <code>tiny")
        < text.index("| ⚠️ WARN | <code>llama-1b")
        < text.index("| ✅ PASS | <code>qwen-0.5b")
    )
    assert (
        text.index("part <code>tiny</code>")
        < text.index("part <code>llama-1b</code>")
        < text.index("part <code>qwen-0.5b</code>")
    )
    assert [p["gate_id"] for p in merged["parts"]] == ["qwen-0.5b", "llama-1b", "tiny"]
    assert "#### ❌ Logprob semantics: FAIL" in text
    # one commands block for all parts, one footer with the merged report's schema
    assert text.count("**Reproduce this run:**") == 1 and text.count("report schema") == 1
    assert "report schema gate-report/1 ·" in text and "report schema ?" not in text
    assert len(text) < 65_536
    assert render_comment(as_report(merged), gate_id="matrix").text.startswith(
        "<!-- gate-report:matrix -->\n"
    )


def test_many_parts_still_fit_one_comment():
    merged = merge(*(report(v, f"m{i}") for i, v in enumerate(["PASS", "WARN", "FAIL"] * 12)))
    out = render_comment(as_report(merged))
    assert len(out.text) < 65_536 and out.dropped
    assert out.text.count("| <code>m") == 36  # every part in the parts table
    assert "omitted to fit GitHub's comment limit; the full report is in the artifact" in out.text
    assert len(render_full(as_report(merged))) > 65_536


def test_cli_merge_writes_the_merged_report(tmp_path, capsys):
    paths = []
    for v in ("PASS", "FAIL"):
        p = tmp_path / v / "report.json"
        p.parent.mkdir()
        p.write_text(json.dumps(report(v)))
        paths.append(p)
    out = tmp_path / "merged.json"
    parser = argparse.ArgumentParser(prog="gate")
    render_cli.register(parser.add_subparsers())
    args = parser.parse_args(["merge", *map(str, paths), "--out", str(out)])
    assert args.func(args) == 0
    merged = json.loads(out.read_text())
    assert merged["verdict"] == "FAIL" and len(merged["parts"]) == 2
    assert "merged 2 part(s)" in capsys.readouterr().err
    # and the merged file renders through `gate report`
    args = parser.parse_args(["report", str(out), "--format", "summary"])
    assert args.func(args) == 0
    assert "## ❌ FAIL: vLLM upgrade gate" in capsys.readouterr().out


def test_cli_merge_names_a_bad_input_file(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(report("PASS")))
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "gate-report/7"}')
    parser = argparse.ArgumentParser(prog="gate")
    render_cli.register(parser.add_subparsers())
    args = parser.parse_args(["merge", str(good), str(bad), "--out", str(tmp_path / "m.json")])
    with pytest.raises(ConfigError, match=r"bad\.json: unsupported report schema"):
        args.func(args)
    assert not (tmp_path / "m.json").exists()


def test_unknown_keys_pass_through_a_merge():
    a, b = report("PASS", "a"), report("FAIL", "b")
    a["checks"][0]["details"]["future"] = {"kept": [1, 2]}
    a["future_top"] = "kept"
    merged = merge(a, b)
    assert merged["parts"][0]["future_top"] == "kept" and "schema" not in merged["parts"][0]
    assert (
        merged["checks"][0]["details"]["future"] == {"kept": [1, 2]}
        and merged["checks"][0]["part"] == "a"
    )
    assert as_report(merged).parts is not None  # the merged document is a valid report
