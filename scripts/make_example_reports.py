#!/usr/bin/env python3
"""Generate docs/examples/{pass,warn,fail,merged,smollm2-pass,smollm2-fail}.md and their report.json files.

``pass``, ``warn`` and ``fail.report.json`` are real ``gate run`` reports with machine paths replaced
by placeholders: the CPU default, and the CPU default with one change on the new engine
(``docs/examples/warn.gate.yaml``: ``generation_config: vllm``; ``fail.gate.yaml``: ``logprobs_mode``
left at vLLM V1's raw default). ``smollm2-pass`` and ``smollm2-fail`` are the same on a real model,
SmolLM2-135M-Instruct in fp32 (``smollm2-pass.gate.yaml``, ``smollm2-fail.gate.yaml``): worst tokens,
greedy answers and diagnoses in a real BPE vocabulary's pieces, which the README's screenshots show.
``--import NAME=RUN_DIR/report.json`` refreshes one from a new run.
``merged`` is ``gate merge`` of the first three. Every .md is rendered by
``gate.render.markdown.render_comment``, so the committed examples are exactly what a PR would show.
``tests/unit/test_render.py`` re-renders them and fails when they are out of date; rerun this
script after changing the renderer.

    python scripts/make_example_reports.py                                 # write the examples
    python scripts/make_example_reports.py --check                         # exit 1 if one is stale
    python scripts/make_example_reports.py --import fail=runs/x/report.json  # a new real report

The real runs (each replays the new engine; the old one's evidence is reused from the cache):

    gate run --out runs/pass && gate run -c docs/examples/warn.gate.yaml --out runs/warn
    gate run -c docs/examples/fail.gate.yaml --out runs/fail
    gate run -c docs/examples/smollm2-pass.gate.yaml --out runs/smollm2-pass
    gate run -c docs/examples/smollm2-fail.gate.yaml --out runs/smollm2-fail
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "docs" / "examples"
NAMES = ("pass", "warn", "fail", "merged", "smollm2-pass", "smollm2-fail")

sys.path.insert(0, str(REPO))
from gate.merge import merge_reports  # noqa: E402
from gate.render.markdown import render_comment  # noqa: E402
from gate.report_model import Report  # noqa: E402

# ----------------------------------------------------------------------------- machine paths


def scrub(value: Any, repo: str = str(REPO), cache: str | None = None) -> Any:
    """Replace machine paths: the checkout becomes relative, caches and home folders placeholders."""
    cache = cache if cache is not None else os.environ.get("GATE_CACHE_DIR", "")
    if isinstance(value, dict):
        return {k: scrub(v, repo, cache) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, repo, cache) for v in value]
    if not isinstance(value, str):
        return value
    s = value.replace(repo.rstrip("/") + "/", "").replace(repo.rstrip("/"), ".")
    if cache and cache.startswith("/"):
        s = s.replace(cache.rstrip("/"), "$GATE_CACHE_DIR")
    s = re.sub(r"/root/\.cache/gate|/home/[^/\s]+/\.cache/gate", "$GATE_CACHE_DIR", s)
    s = re.sub(r"/tmp/[^\s\"']+", "runs/<run>", s)
    s = re.sub(r"/(?:root|home/[^/\s]+)(?=/|\s|$)", "~", s)
    return s


def import_report(path: Path) -> dict:
    raw = json.loads(path.read_text(encoding="utf-8"))
    run_dir = str(raw.get("run", {}).get("dir") or "")
    text = json.dumps(raw)
    if run_dir.startswith("/"):  # the run folder, wherever it was, is runs/<run>
        text = text.replace(json.dumps(run_dir.rstrip("/"))[1:-1], "runs/<run>")
    report = scrub(json.loads(text))
    report["run"]["dir"] = "runs/<run>"
    return report


# ------------------------------------------------------------------------------ the examples

SOURCES = ("pass", "warn", "fail", "smollm2-pass", "smollm2-fail")  # real reports
MERGED_FROM = ("pass", "warn", "fail")


def build_all(sources: dict[str, dict]) -> dict[str, dict]:
    reports = {name: copy.deepcopy(sources[name]) for name in SOURCES}
    parts = []
    for name in MERGED_FROM:
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


def outputs(sources: dict[str, dict]) -> dict[str, str]:
    """Every file under docs/examples/ this script owns, by name, with its content."""
    reports = build_all(sources)
    files = {f"{n}.report.json": dumps(r) for n, r in reports.items()}
    files |= {f"{n}.md": text for n, text in render_all(reports).items()}
    return files


def committed_sources() -> dict[str, dict]:
    paths = {n: EXAMPLES / f"{n}.report.json" for n in SOURCES}
    return {n: json.loads(p.read_text(encoding="utf-8")) for n, p in paths.items() if p.exists()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="NAME=REPORT",
        help=f"a real report.json to become NAME.report.json (paths scrubbed); NAME: {', '.join(SOURCES)}",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a committed example differs from what the code renders",
    )
    args = parser.parse_args(argv)
    sources = committed_sources()
    for item in args.imports:
        name, _, path = item.partition("=")
        if name not in SOURCES or not path:
            parser.error(f"--import {item}: expected NAME=REPORT with NAME one of {SOURCES}")
        sources[name] = import_report(Path(path))
    if missing := [n for n in SOURCES if n not in sources]:
        parser.error(f"no report for {', '.join(missing)}: --import NAME=RUN_DIR/report.json")
    stale = []
    for name, text in outputs(sources).items():
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
