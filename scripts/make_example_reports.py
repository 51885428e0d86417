#!/usr/bin/env python3
"""Generate docs/examples/{pass,warn,fail,merged}.md and the report.json files they come from.

``pass.report.json`` is a real ``gate run`` report of the CPU default with machine paths replaced by
placeholders (``--import RUN_DIR/report.json`` refreshes it from a new run); the WARN and FAIL
reports are derived from it here, deterministically (no clock, no randomness), and ``merged`` is
``gate merge`` of the three. Every .md is rendered by ``gate.render.markdown.render_comment``, so
the committed examples are exactly what a PR would show. ``tests/unit/test_render.py`` re-renders
them and fails when they are out of date; rerun this script after changing the renderer.

    python scripts/make_example_reports.py            # write the examples
    python scripts/make_example_reports.py --check    # exit 1 if a committed example is stale
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "docs" / "examples"
NAMES = ("pass", "warn", "fail", "merged")

sys.path.insert(0, str(REPO))
from gate.merge import merge_reports  # noqa: E402
from gate.render.markdown import render_comment  # noqa: E402
from gate.report_model import Report  # noqa: E402

# ----------------------------------------------------------------------------- machine paths


def scrub(value: Any, repo: str = str(REPO)) -> Any:
    """Replace machine paths: the checkout becomes relative, caches and home folders placeholders."""
    if isinstance(value, dict):
        return {k: scrub(v, repo) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, repo) for v in value]
    if not isinstance(value, str):
        return value
    s = value.replace(repo.rstrip("/") + "/", "").replace(repo.rstrip("/"), ".")
    s = re.sub(r"/root/\.cache/gate|/home/[^/\s]+/\.cache/gate", "$GATE_CACHE_DIR", s)
    s = re.sub(r"/tmp/[^\s\"']+", "runs/<run>", s)
    s = re.sub(r"/(?:root|home/[^/\s]+)(?=/|\s|$)", "~", s)
    return s


def import_report(path: Path) -> dict:
    report = scrub(json.loads(path.read_text(encoding="utf-8")))
    report["run"]["dir"] = "runs/<run>"
    return report


# ------------------------------------------------------------------------------ builders


def m(name: str, value: float | None, status: str = "PASS", warn: float | None = None, fail: float | None = None,
      engine: str | None = None, note: str = "", higher_is_worse: bool = True) -> dict:  # fmt: skip
    return {"name": name, "value": value, "status": status, "warn": warn, "fail": fail,
            "higher_is_worse": higher_is_worse, "engine": engine, "note": note}  # fmt: skip


def _check(report: dict, check_id: str) -> dict:
    return next(c for c in report["checks"] if c["id"] == check_id)


def _finish(report: dict) -> dict:
    rank = {"SKIP": 0, "PASS": 1, "WARN": 2, "FAIL": 3, "ERROR": 4}
    statuses = [c["status"] for c in report["checks"]] + [report["baseline"]["status"]]
    report["verdict"] = max(statuses, key=rank.__getitem__)
    report["counts"] = {
        s: sum(c["status"] == s for c in report["checks"])
        for s in ("PASS", "WARN", "FAIL", "ERROR", "SKIP")
    }
    fail = report["verdict"] == "FAIL" or (
        report["fail_on"] == "warn" and report["verdict"] == "WARN"
    )
    report["exit_code"] = 3 if report["verdict"] == "ERROR" else int(fail)
    return report


def _trajectory(steps: int, start: float, end: float, wiggle: float, phase: float) -> list[float]:
    return [
        round(
            start
            + (end - start) * (1 - math.exp(-3 * i / steps))
            + wiggle * math.sin(0.7 * i + phase),
            6,
        )
        for i in range(steps)
    ]


def grpo_trajectories(steps: int = 50) -> dict:
    """A mini GRPO run, old vs new engine, with the old engine's seed band: the new engine's k3 KL leaves it late."""
    metrics, first_exit = {}, {}
    spec = {  # name: (start, end, wiggle, band half-width)
        "mean_reward": (0.21, 0.64, 0.015, 0.05),
        "k3_kl": (0.0002, 0.0011, 0.00004, 0.0002),
        "clip_frac": (0.004, 0.018, 0.001, 0.004),
        "entropy": (1.32, 0.91, 0.01, 0.06),
    }
    for name, (start, end, wiggle, half) in spec.items():
        old = _trajectory(steps, start, end, wiggle, 0.0)
        new = _trajectory(steps, start, end, wiggle, 1.3)
        if name == "k3_kl":  # the new engine's KL creeps up late in the run
            new = [round(v + (max(0, i - 30) * 0.00004), 6) for i, v in enumerate(new)]
        low = [round(v - half, 6) for v in old]
        high = [round(v + half, 6) for v in old]
        metrics[name] = {"old": old, "new": new, "band_low": low, "band_high": high}
        first_exit[name] = next((i for i, v in enumerate(new) if not low[i] <= v <= high[i]), None)
    return {"steps": steps, "metrics": metrics, "first_exit": first_exit}


def build_warn(template: dict) -> dict:
    """Greedy completions moved a little and the new engine picked another attention backend."""
    r = copy.deepcopy(template)
    r["engines"]["new"]["effective"]["attention_backend"] = "CPU_ATTN"
    g = _check(r, "greedy-and-length")
    g.update(
        status="WARN",
        summary="greedy match 91% vs baseline, length x1.031",
        diagnosis="Greedy completions or output lengths moved. If forward drift is clean, look at sampling-side changes "
        "(generation defaults from generation_config.json, stop tokens, detokenization); otherwise fix the forward drift first.",
        measurements=[
            m(
                "greedy_exact_match_rate",
                0.9125,
                "WARN",
                0.95,
                0.8,
                "vs baseline",
                higher_is_worse=False,
            ),
            m("length_ratio_deviation", 0.03125, "PASS", 0.05, 0.1, "vs baseline"),
            m(
                "greedy_exact_match_rate",
                0.9125,
                "WARN",
                0.95,
                0.8,
                "vs old",
                higher_is_worse=False,
            ),
            m("length_ratio_deviation", 0.03125, "PASS", 0.05, 0.1, "vs old"),
        ],
    )
    greedy = {
        "n_sequences": 80,
        "exact_match_rate": 0.9125,
        "mean_first_divergence": 9.43,
        "diverging_prompts": [3, 17, 22, 40, 41, 58, 66],
    }
    g["details"] = {
        "baseline": {"greedy": greedy, "length_ratio": 1.03125},
        "old": {"greedy": greedy, "length_ratio": 1.03125},
    }
    c = _check(r, "config-parity")
    c.update(
        status="WARN",
        summary="1 setting(s) differ from old, 1 not acknowledged",
        diagnosis="Settings that change RL behaviour differ between the engines: attention_backend changed None -> 'CPU_ATTN': "
        "pin it in engine_args. If a change is intended, list it under `acknowledge:` in the gate config.",
        measurements=[
            m("attention_backend", None, "WARN", note="None -> 'CPU_ATTN' (policy: warn)")
        ],
    )
    c["details"] = {
        "compared_with": "old",
        "overridden_by_engine": {},
        "diff": {"attention_backend": {"old": None, "new": "CPU_ATTN"}},
        "acknowledged": [],
    }
    r["grpo"] = grpo_trajectories()
    return _finish(r)


WORST_TOKENS = [
    # (prompt id, context, token, engine logprob, trainer logprob)
    ("arith-017", "68+75=8+5=13;6+7+1=", "1", -0.0912, -1.4127),
    ("arith-041", "39+46=9+6=15;3+4+1=", "8", -0.2231, -1.2764),
    ("arith-005", "54+29=4+9=13;5+2+1=8;#", "8", -0.0513, -0.9987),
    ("general-07", "<|user|>Name a primary colour.<|assistant|>", " Blue", -0.6931, -1.5978),
    ("arith-022", "77+18=7+8=15;7+1+1=9;#9", "5", -0.0305, -0.8121),
    ("arith-058", "23+69=3+9=12;2+6+1=", "9", -0.1054, -0.8533),
    ("general-11", "<|user|>What do bees make?<|assistant|>Bees make", " honey", -0.0202, -0.6570),
    ("arith-063", "45+45=5+5=10;4+4+1=9;#", "9", -0.0408, -0.6215),
]


def build_fail(template: dict) -> dict:
    """The new engine returns raw logprobs and turned prefix caching on: the classic silent V1 upgrade."""
    r = copy.deepcopy(template)
    eff = r["engines"]["new"]["effective"]
    eff["logprobs_mode"] = "raw_logprobs"
    eff["enable_prefix_caching"] = True
    s = _check(r, "logprob-semantics")
    s.update(
        status="FAIL",
        summary="new reports raw, old reports processed (expected processed)",
        diagnosis="The new engine reports raw logprobs (engine logprobs_mode='raw_logprobs') but the trainer expects processed: "
        "importance ratios and KL are computed against the wrong distribution. Fix: set the engine argument "
        "logprobs_mode='processed_logprobs' (vLLM >= 0.10) so reported logprobs are those of the distribution the token was sampled from.",
        measurements=[
            m("mean_abs_diff_processed", 1.189e-07, engine="old"),
            m("mean_abs_diff_raw", 0.03696, engine="old"),
            m("mean_abs_diff_processed", 0.03812, engine="new"),
            m("mean_abs_diff_raw", 1.262e-07, engine="new"),
        ],
    )
    s["details"] = {"semantics": {"old": "processed", "new": "raw"}, "expect": "processed",
                    "engine_mode": {"old": "processed_logprobs", "new": "raw_logprobs"}}  # fmt: skip
    t = _check(r, "train-inference-mismatch")
    new_stats = {
        "token_mult_prob_error": 1.0871,
        "k3_kl": 0.01423,
        "clip_frac_token": 0.0641,
        "ess": 0.7112,
    }
    t["measurements"] = [x for x in t["measurements"] if x["engine"] == "old"] + [
        m("token_mult_prob_error", 1.0871, "WARN", 1.05, 1.1, "new"),
        m("k3_kl", 0.01423, "FAIL", 0.001, 0.01, "new"),
        m("clip_frac_token", 0.0641, "WARN", 0.02, 0.1, "new"),
        m("ess", 0.7112, "PASS", 0.5, 0.3, "new", higher_is_worse=False),
        m("mean_abs_diff", 0.03812, engine="new"),
        m("p99_abs_diff", 0.2317, engine="new"),
        m("max_abs_diff", 1.3215, engine="new"),
        m("k1_kl", 0.03641, engine="new"),
        m("clip_frac_seq", 0.3125, engine="new"),
        m("prob_pearson", 0.9874, engine="new"),
        m(
            "regression_mean_abs_diff",
            0.03471,
            "FAIL",
            0.002,
            0.01,
            note="increase +0.0381, 95% CI [+0.0347, +0.0415]",
        ),
    ]
    t.update(
        status="FAIL",
        summary="new: token_mult_prob_error 1.0871, k3 KL 1.42e-02, clip 6.41%",
        diagnosis="The new engine's logprobs are further from the trainer's than allowed: k3_kl (new) = 0.01423, "
        "regression_mean_abs_diff = 0.03471. Check the engine's logprob semantics and precision first (logprobs_mode, dtype, "
        "an fp32 lm_head on both sides); objective-side corrections such as truncated importance sampling would only hide an engine bug.",
    )
    t["details"]["new"].update(new_stats, mean_abs_diff=0.03812, p99_abs_diff=0.2317, max_abs_diff=1.3215, k1_kl=0.03641,
                               clip_frac_seq=0.3125, prob_pearson=0.9874)  # fmt: skip
    t["details"]["regression"] = {"low": 0.03471, "high": 0.04152, "point": 0.03812}
    t["details"]["worst_tokens"] = [
        {
            "engine": "new",
            "prompt_id": p,
            "context": ctx,
            "token": tok,
            "engine_logprob": e,
            "trainer_logprob": tr,
        }
        for p, ctx, tok, e, tr in WORST_TOKENS
    ]
    c = _check(r, "config-parity")
    c.update(
        status="FAIL",
        summary="2 setting(s) differ from old, 2 not acknowledged",
        diagnosis="Settings that change RL behaviour differ between the engines: enable_prefix_caching changed False -> True: "
        "pass enable_prefix_caching=False (V1 enables it by default; stale cache entries survive weight updates); logprobs_mode "
        "changed 'processed_logprobs' -> 'raw_logprobs': pass logprobs_mode='processed_logprobs' so logprobs match the sampling "
        "distribution. If a change is intended, list it under `acknowledge:` in the gate config.",
        measurements=[
            m("enable_prefix_caching", None, "FAIL", note="False -> True (policy: fail)"),
            m(
                "logprobs_mode",
                None,
                "FAIL",
                note="'processed_logprobs' -> 'raw_logprobs' (policy: fail)",
            ),
        ],
    )
    c["details"] = {
        "compared_with": "old",
        "overridden_by_engine": {},
        "diff": {
            "enable_prefix_caching": {"old": False, "new": True},
            "logprobs_mode": {"old": "processed_logprobs", "new": "raw_logprobs"},
        },
        "acknowledged": [],
    }
    return _finish(r)


def build_all(template: dict) -> dict[str, dict]:
    reports = {
        "pass": copy.deepcopy(template),
        "warn": build_warn(template),
        "fail": build_fail(template),
    }
    parts = []
    for name in ("pass", "warn", "fail"):
        part = copy.deepcopy(reports[name])
        part["gate_id"] = f"{part['gate_id']}-{name}"
        parts.append(Report.from_dict(part, f"the {name} example"))
    reports["merged"] = merge_reports(parts)
    return reports


def render_all(reports: dict[str, dict]) -> dict[str, str]:
    return {
        name: render_comment(Report.from_dict(report, f"the {name} example")).text
        for name, report in reports.items()
    }


_NUMBER_LIST = re.compile(r"\[\s+((?:-?[0-9.eE+-]+|null)(?:,\s+(?:-?[0-9.eE+-]+|null))*)\s+\]")


def dumps(report: dict) -> str:
    """Indented JSON with lists of numbers on one line (trajectories stay readable in a diff)."""
    text = json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False)
    return (
        _NUMBER_LIST.sub(
            lambda mt: "[" + ", ".join(x.strip() for x in mt.group(1).split(",")) + "]", text
        )
        + "\n"
    )


def outputs(template: dict) -> dict[str, str]:
    """Every file under docs/examples/ this script owns, by name, with its content."""
    reports = build_all(template)
    files = {f"{n}.report.json": dumps(r) for n, r in reports.items()}
    files |= {f"{n}.md": text for n, text in render_all(reports).items()}
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--import",
        dest="source",
        type=Path,
        help="a real PASS report.json to become pass.report.json (paths scrubbed)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a committed example differs from what the code renders",
    )
    args = parser.parse_args(argv)
    template_path = EXAMPLES / "pass.report.json"
    template = (
        import_report(args.source)
        if args.source
        else json.loads(template_path.read_text(encoding="utf-8"))
    )
    stale = []
    for name, text in outputs(template).items():
        path = EXAMPLES / name
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(name)
        if not args.check:
            EXAMPLES.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    verb = "out of date" if args.check else "written"
    print(f"{len(stale)} example file(s) {verb}: {', '.join(stale) or 'none'}", file=sys.stderr)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
