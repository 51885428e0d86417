#!/usr/bin/env python3
"""The trainer-side reference's scoring throughput against a bare transformers forward.

Run with an engine environment's Python (torch and transformers), from the checkout:

    PYTHONPATH=. ENGINE_PY scripts/bench_reference.py MODEL_DIR [--dtype bfloat16] [--lm-head-fp32]
        [--sequences 16] [--length 128] [--temperature 0.7] [--top-p 0.9] [--top-k 0] [--repeats 2]

Both score the same random token sequences (seeded), teacher-forced, in the same trunk dtype:
the bare side is ``model(ids).logits`` then ``log_softmax`` and a gather of the next tokens (what a
trainer computes); the reference side is ``gate.worker.reference.ReferenceModel.score`` with the
sampling transform (raw, processed and bf16-head logprobs, top-k/top-p boundary flags). Prints
tokens/s of each, their ratio, and the reference's trunk alone (the rest of its time is the
49k-wide work per token: projections, softmaxes, the top-k/top-p mask). Medians of ``--repeats``
after one warm-up; CPU threads: torch's default (set OMP_NUM_THREADS to pin).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import numpy as np
import torch


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--lm-head-fp32", action="store_true")
    p.add_argument("--sequences", type=int, default=16)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--repeats", type=int, default=2)
    return p.parse_args()


def _timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.inference_mode()
def _bare_score(model, ids: torch.Tensor) -> None:
    """What a trainer computes: the full logits, log_softmax, the next tokens' entries."""
    logits = model(input_ids=ids).logits[:, :-1].float()
    torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1))


def main() -> int:
    args = _args()
    from transformers import AutoModelForCausalLM

    from gate.worker.engine import prepare_process
    from gate.worker.reference import ReferenceModel, SamplingTransform

    prepare_process()  # bf16 kernels on CPU need AMX permission, as in the worker
    dtype = getattr(torch, args.dtype)
    bare = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).eval()
    vocab = bare.config.vocab_size
    rng = np.random.default_rng(0)
    seqs = [rng.integers(3, vocab, size=args.length).tolist() for _ in range(args.sequences)]
    ids = torch.tensor(seqs)
    targets = args.sequences * (args.length - 1)

    bare_s = _timed(functools.partial(_bare_score, bare, ids), args.repeats)
    del bare  # one model in memory at a time

    ref = ReferenceModel(args.model, args.dtype, args.lm_head_fp32, "cpu")
    transform = SamplingTransform(args.temperature, args.top_k, args.top_p, mask_dtype=None)
    ref_s = _timed(lambda: ref.score(seqs, [1] * len(seqs), transform, 16384), args.repeats)
    with torch.inference_mode():
        trunk_s = _timed(lambda: ref.trunk(input_ids=ids), args.repeats)
    result = {
        "model": args.model.rstrip("/").rsplit("/", 1)[-1],
        "dtype": args.dtype,
        "lm_head_fp32": args.lm_head_fp32,
        "targets": targets,
        "transform": {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k},
        "threads": torch.get_num_threads(),
        "bare_tokens_per_s": round(targets / bare_s, 1),
        "reference_tokens_per_s": round(targets / ref_s, 1),
        "ratio": round(bare_s / ref_s, 3),
        "bare_s": round(bare_s, 3),
        "reference_s": round(ref_s, 3),
        "reference_trunk_s": round(trunk_s, 3),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
