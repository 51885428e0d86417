"""Write docs/compatibility.md: what each vLLM release offers the worker, read from its source.

    python scripts/make_compat_table.py            # fetch missing releases into the cache, write the page
    python scripts/make_compat_table.py --cached   # only from the cache; fails when a release is missing
    python scripts/make_compat_table.py --check    # exit 1 when the committed page differs

The releases are gate.compat.RELEASES; each one's wheel is downloaded once and reduced to a few
source files under $GATE_CACHE_DIR/vllm-source (gate/vllm_source.py). tests/compat checks the
same findings and that the committed page is exactly this rendering.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gate import compat, vllm_source  # noqa: E402 - importable once the checkout is on sys.path

PAGE = REPO / "docs" / "compatibility.md"
YES, NO = "✓", "✗"

# Column order of the release table: the push path first, then what the recorded evidence needs.
API_COLUMNS = (
    compat.COLLECTIVE_RPC, compat.RESET_PREFIX_CACHE, compat.RELOAD_WEIGHTS_ITERATOR, compat.RELOAD_WEIGHTS_PATH,
    compat.RUNNER_LOAD_WEIGHTS,
    compat.LOGPROBS_MODE, compat.FLAT_LOGPROBS, compat.DEFAULT_SAMPLING_PARAMS, compat.DIFF_SAMPLING_PARAM,
    compat.WT_INIT, compat.WT_START, compat.WT_UPDATE, compat.WT_FINISH,
)  # fmt: skip


def cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def collect(
    versions=compat.RELEASES, cache_dir=None, fetch: bool = True, progress=print
) -> dict[str, dict]:
    """{version: {feature key: Finding}}; FetchError / LookupError when a release cannot be read."""
    out = {}
    for v in versions:
        root = vllm_source.cached_source(v, cache_dir)
        if root is None:
            if not fetch:
                raise LookupError(
                    f"vllm {v} is not in the cache ({vllm_source.cache_root(cache_dir)})"
                )
            progress(f"fetching vllm {v} (~500 MB wheel, reduced to a few source files)")
            root = vllm_source.ensure_source(v, cache_dir)
        out[v] = vllm_source.check_release(root)
    return out


def push_cell(findings: dict, multiprocess: bool = False) -> str:
    _, detail = compat.worker_path({k: f.present for k, f in findings.items()}, multiprocess)
    return " + ".join(detail) if isinstance(detail, tuple) else detail  # the steps, or the reason


def release_table(results: dict[str, dict]) -> str:
    labels = {f.key: f.label for f in compat.FEATURES}
    lines = [
        "| release | weight push the worker takes | with workers in other processes (TP/PP > 1) | "
        + " | ".join(f"`{labels[k]}`" for k in API_COLUMNS)
        + " |",
        "| --- | --- | --- |" + " :-: |" * len(API_COLUMNS),
    ]
    for v, findings in results.items():
        marks = " | ".join(YES if findings[k].present else NO for k in API_COLUMNS)
        lines.append(
            f"| {v} | {cell(push_cell(findings))} | {cell(push_cell(findings, True))} | {marks} |"
        )
    return "\n".join(lines)


def _ranges(versions: list[str], values: list[str]) -> list[tuple[str, str]]:
    """Consecutive releases with the same value, as ("0.10.2–0.12.0", value)."""
    out: list[tuple[str, str]] = []
    start = 0
    for i in range(1, len(versions) + 1):
        if i == len(versions) or values[i] != values[start]:
            span = versions[start] if i - 1 == start else f"{versions[start]}–{versions[i - 1]}"
            out.append((span, values[start]))
            start = i
    return out


def settings_table(results: dict[str, dict]) -> str:
    versions = list(results)
    names = [k for k in next(iter(results.values())) if k.startswith(compat.SETTING_PREFIX)]
    lines = [
        "| setting | releases | attribute path the worker reads |",
        "| --- | --- | --- |",
    ]
    for key in names:
        values = [f"`llm_engine.{f.note}`" if (f := results[v][key]).present else f"none: recorded as null ({f.note})"
                  for v in versions]  # fmt: skip
        for span, value in _ranges(versions, values):
            lines.append(f"| {key.removeprefix(compat.SETTING_PREFIX)} | {span} | {cell(value)} |")
    return "\n".join(lines)


def where_table(results: dict[str, dict]) -> str:
    """Where each feature is defined in the newest release that has it (files move between releases)."""
    lines = [
        "| feature | defined in (newest release with it) | what the worker needs it for |",
        "| --- | --- | --- |",
    ]
    for f in compat.FEATURES:
        having = [(v, r[f.key]) for v, r in results.items() if r[f.key].present]
        where = f"`{having[-1][1].where}` ({having[-1][0]})" if having else "in no release listed"
        lines.append(f"| `{f.key}` | {where} | {cell(f.needs)} |")
    return "\n".join(lines)


def render(results: dict[str, dict]) -> str:
    first, last = next(iter(results)), list(results)[-1]
    return f"""<!-- generated by scripts/make_compat_table.py from the vLLM wheels' source; do not edit -->
# vLLM compatibility of the engine worker

What each vLLM release from {first} to {last} (the last patch of every minor release) offers the
engine worker, read statically from the release's CUDA wheel: its Python source, parsed, never
imported or run. {YES} means the source defines it where the worker looks; it says nothing about
numerics, which only the gate's own runs measure. `tests/compat` asserts these findings and that
this page is current; `python scripts/make_compat_table.py` regenerates it.

The weight push follows `gate.compat.worker_path`: every push runs on the workers through
`LLM.collective_rpc`. Workers in the worker's own process (TP=1, the default executor) get a
function: `reload_weights(weights_iterator=...)` where the worker accepts it and
`model_runner.model.load_weights(...)` otherwise. Workers in other processes (tensor or pipeline
parallel, an `mp` or `ray` executor) cannot be sent a function or a tensor: the driver writes the
weights once as safetensors into a tmpfs folder and every rank runs
`reload_weights(weights_path=...)` by name. Then the prefix cache is reset. A configured
`weight_update.hook` replaces all of this. Every call carries a timeout (`timeout=` exists in every
release listed).

## Releases

{release_table(results)}

## Where each feature lives

{where_table(results)}

## Effective settings

The worker records each setting from the first of its attribute paths (`_SETTINGS` in
`gate/worker/engine.py`) that the release defines; "none" means no path exists and engine.json
records null.

{settings_table(results)}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cached", action="store_true", help="read only the cache; never download")
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare with the committed page instead of writing it",
    )
    args = parser.parse_args(argv)
    try:
        results = collect(fetch=not args.cached, progress=lambda m: print(m, file=sys.stderr))
    except (vllm_source.FetchError, LookupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    page = render(results)
    if args.check:
        if PAGE.read_text(encoding="utf-8") != page:
            print(
                f"{PAGE.relative_to(REPO)} is stale: run python scripts/make_compat_table.py",
                file=sys.stderr,
            )
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(REPO)} ({len(results)} releases)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
