#!/usr/bin/env python3
"""Time each function of ``gate.metrics`` on synthetic data and print seconds per call.

The data mimic one gate run: ``--tokens`` generated tokens in sequences of ``--seq-len`` tokens,
``--samples`` sequences per prompt, float32 logprobs with a small trainer/engine difference, top-k
id lists of width ``--topk`` and greedy completions that diverge now and then. Each function is
timed ``--repeat`` times; the table shows the best and the median (the best is the figure to compare
across machines, the median shows the noise).

The judging budget: the per-token metrics every run computes (``mismatch``, ``greedy_agreement``
and logprob-integrity's ``top_list_findings``) take under JUDGE_BUDGET_S_PER_MILLION_TOKENS together, best against best.
--check exits 1 where they do not; run it on a quiet machine (a loaded runner measures the load).

Usage::

    python scripts/bench_metrics.py [--tokens 1000000] [--repeat 5] [--seq-len 50] [--topk 5] [--check]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent)
)  # run from a checkout without installing

from gate import metrics
from gate.checks.logprob_integrity import top_list_findings

# The two metrics that grow with every generated token; the rest is per sequence or per prompt.
JUDGE_FUNCTIONS = ("mismatch", "greedy_agreement", "top_list_findings")
JUDGE_BUDGET_S_PER_MILLION_TOKENS = 1.0


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tokens", type=int, default=1_000_000, help="generated tokens (default 1,000,000)"
    )
    parser.add_argument(
        "--repeat", type=int, default=5, help="timed calls per function (default 5)"
    )
    parser.add_argument("--seq-len", type=int, default=50, help="tokens per sequence (default 50)")
    parser.add_argument("--samples", type=int, default=8, help="sequences per prompt (default 8)")
    parser.add_argument(
        "--topk", type=int, default=5, help="width of the top-k id lists (default 5)"
    )
    parser.add_argument(
        "--n-boot", type=int, default=2000, help="bootstrap resamples (default 2000)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 where the judging budget is exceeded"
    )
    args = parser.parse_args(argv)
    for name in ("tokens", "repeat", "seq_len", "samples", "topk", "n_boot"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def _workload(args: argparse.Namespace) -> dict[str, Callable[[], object]]:
    """One closure per metric, over data built once (data generation is not timed)."""
    rng = np.random.default_rng(args.seed)
    n_seq = max(1, args.tokens // args.seq_len)
    offsets = np.arange(n_seq + 1, dtype=np.int64) * args.seq_len
    n_tokens = int(offsets[-1])
    lp_engine = (-rng.exponential(1.0, n_tokens)).astype(np.float32)
    lp_trainer = (lp_engine + rng.normal(0.0, 0.01, n_tokens)).astype(np.float32)
    lp_raw = (lp_engine - 0.3).astype(np.float32)

    n_prompts = max(1, n_seq // args.samples)
    prompt_index = np.arange(n_seq, dtype=np.int64) % n_prompts
    per_prompt_new = metrics.per_group_mean(
        lp_trainer - lp_engine, offsets, prompt_index, n_prompts
    )
    per_prompt_old = per_prompt_new + rng.normal(0.0, 1e-3, n_prompts)

    vocab = 32_000
    topk_a = rng.integers(0, vocab, size=(n_tokens, args.topk))
    topk_b = topk_a.copy()
    topk_b[::7, -1] = rng.integers(
        0, vocab, size=topk_b[::7].shape[0]
    )  # some lists differ in the tail

    # Top lists as the engine returns them: values descending, the sampled token first (rank 1).
    top_values = -np.sort(rng.exponential(1.0, size=(n_tokens, args.topk)), axis=1).astype(
        np.float32
    )
    sampled, ranks = topk_a[:, 0], np.ones(n_tokens, dtype=np.int64)

    greedy_a = rng.integers(0, vocab, n_tokens)
    greedy_b = greedy_a.copy()
    greedy_b[::997] += 1  # scattered divergences

    return {
        "mismatch": lambda: metrics.mismatch(lp_trainer, lp_engine, offsets),
        "per_sequence_mean": lambda: metrics.per_sequence_mean(lp_trainer, offsets),
        "per_group_mean": lambda: metrics.per_group_mean(
            lp_trainer, offsets, prompt_index, n_prompts
        ),
        f"bootstrap_mean_diff_ci ({n_prompts} units)": lambda: metrics.bootstrap_mean_diff_ci(
            per_prompt_new, per_prompt_old, n_boot=args.n_boot
        ),
        f"topk_overlap (k={args.topk})": lambda: metrics.topk_overlap(topk_a, topk_b),
        "greedy_agreement": lambda: metrics.greedy_agreement(greedy_a, offsets, greedy_b, offsets),
        "length_ratio": lambda: metrics.length_ratio(offsets, offsets),
        "top_list_findings": lambda: top_list_findings(
            topk_a, top_values, sampled, top_values[:, 0], ranks, vocab
        ),
        "logprob_semantics_distances": lambda: metrics.logprob_semantics_distances(
            lp_engine, lp_trainer, lp_raw
        ),
    }


def _time(fn: Callable[[], object], repeat: int) -> list[float]:
    fn()  # warm-up: first-touch page faults and lazy imports would otherwise land in the first sample
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    work = _workload(args)
    n_tokens = (args.tokens // args.seq_len or 1) * args.seq_len
    print(
        f"gate.metrics on {n_tokens:,} tokens ({n_tokens // args.seq_len:,} sequences of {args.seq_len}), "
        f"best and median of {args.repeat}, numpy {np.__version__}"
    )
    width = max(len(name) for name in work)
    print(f"{'function':<{width}}  {'best s':>8}  {'median s':>8}")
    print(f"{'-' * width}  {'-' * 8}  {'-' * 8}")
    best: dict[str, float] = {}
    for name, fn in work.items():
        samples = _time(fn, args.repeat)
        best[name] = min(samples)
        print(f"{name:<{width}}  {best[name]:8.4f}  {statistics.median(samples):8.4f}")
    judged = sum(best[name] for name in JUDGE_FUNCTIONS)
    budget = JUDGE_BUDGET_S_PER_MILLION_TOKENS * n_tokens / 1e6
    over = judged > budget
    print(
        f"{' + '.join(JUDGE_FUNCTIONS)}: {judged:.4f} s, budget {budget:.4f} s"
        + (" (OVER)" if over else "")
    )
    return 1 if args.check and over else 0


if __name__ == "__main__":
    sys.exit(main())
