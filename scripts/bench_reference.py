#!/usr/bin/env python3
"""The trainer-side reference's scoring throughput against a bare transformers forward.

Run with an engine environment's Python (torch and transformers), from the checkout:

    PYTHONPATH=. ENGINE_PY scripts/bench_reference.py MODEL_DIR [--dtype bfloat16] [--lm-head-fp32]
        [--sequences 16] [--length 128] [--temperature 0.7] [--top-p 0.9] [--top-k 0] [--repeats 2]
        [--tokens sampled|random]

Both score the same token sequences, teacher-forced, in the same trunk dtype. ``sampled`` (the
default) are what RL scores: the model's own completions of the chat prompt set
(gate/assets/prompts/chat.jsonl, through its chat template, sampled at the benchmark's temperature
and top-p, seeded), cut or repeated to ``--sequences`` of ``--length`` tokens. ``random`` are
uniform random ids: the model is lost on them, so almost every position's nucleus is wide, the
reference's worst case (it then sorts whole rows).
the bare side is ``model(ids).logits`` then ``log_softmax`` and a gather of the next tokens (what a
trainer computes; with ``--lm-head-fp32`` the trunk's states through the head in fp32, as a trainer
with an fp32 head computes them); the reference side is ``gate.worker.reference.ReferenceModel.score`` with the
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
from pathlib import Path

import numpy as np
import torch

CHAT_PROMPTS = Path(__file__).resolve().parent.parent / "gate" / "assets" / "prompts" / "chat.jsonl"


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
    p.add_argument("--tokens", default="sampled", choices=["sampled", "random"])
    return p.parse_args()


def _sampled_sequences(model, path: str, args: argparse.Namespace) -> list[list[int]]:
    """The model's own completions of the chat prompts, each prompt + completion cut to --length."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    chats = [
        json.loads(line)["messages"]
        for line in CHAT_PROMPTS.read_text(encoding="utf-8").splitlines()
    ]
    torch.manual_seed(0)
    seqs = []
    for messages in chats[: args.sequences]:
        prompt = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.inference_mode():
            out = model.generate(**prompt, do_sample=True, temperature=args.temperature, top_p=args.top_p,
                                 top_k=args.top_k or None, min_new_tokens=args.length, max_new_tokens=args.length)  # fmt: skip
        seqs.append(out[0, : args.length].tolist())
    while len(seqs) < args.sequences:
        seqs.append(seqs[len(seqs) % len(chats)])
    return seqs


def _timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.inference_mode()
def _bare_score(model, ids: torch.Tensor, head_fp32: torch.Tensor | None) -> None:
    """What a trainer computes: the full logits, log_softmax, the next tokens' entries; with an fp32
    head (``head_fp32``: the projection's weight in fp32) the trunk's states projected in fp32."""
    if head_fp32 is None:
        logits = model(input_ids=ids).logits[:, :-1].float()
    else:
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state[:, :-1]
        logits = hidden.float() @ head_fp32.T
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
    if args.tokens == "sampled":
        seqs = _sampled_sequences(bare, args.model, args)
    else:
        rng = np.random.default_rng(0)
        seqs = [rng.integers(3, vocab, size=args.length).tolist() for _ in range(args.sequences)]
    ids = torch.tensor(seqs)
    targets = args.sequences * (args.length - 1)

    head = bare.get_output_embeddings().weight.detach().float() if args.lm_head_fp32 else None
    bare_s = _timed(functools.partial(_bare_score, bare, ids, head), args.repeats)
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
        "tokens": args.tokens,
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
