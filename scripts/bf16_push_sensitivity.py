#!/usr/bin/env python3
"""How far a bf16 model's logprobs sit from fp32 at the checkpoint and after the weight-sync
probe's perturbations: what the weight-sync check's "4x the pre-update mismatch" limit meets.

Run with an engine environment's Python (torch and transformers), from the checkout:

    PYTHONPATH=. ENGINE_PY scripts/bf16_push_sensitivity.py MODEL_DIR [--scales 0 0.05 0.2]

Per perturbation scale (``gate.worker.policy_weights.perturbed``, x each tensor's std): greedy
continuations of 8 chat prompts in bf16, then the mean |logprob difference| of those tokens between
the bf16 model and fp32 (bf16 head vs fp32 head on the bf16 trunk's states; bf16 trunk vs fp32
trunk, both with an fp32 head; both together).
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gate.worker.policy_weights import perturbed

QUESTIONS = ["What is the capital of France?", "Name a fruit.", "Tell me about the sea.",
             "What do bees make?", "How many legs has a cat?", "Say hi.", "Count to five.", "What is 2+2?"]  # fmt: skip


def _picked(logits: torch.Tensor, seq: list[int], start: int) -> torch.Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)
    return (
        logp[start - 1 : len(seq) - 1]
        .gather(-1, torch.tensor(seq[start:]).unsqueeze(-1))
        .squeeze(-1)
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--scales", type=float, nargs="+", default=[0.0, 0.05, 0.2])
    args = p.parse_args()
    tok = AutoTokenizer.from_pretrained(args.model)
    bf16 = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).eval()
    fp32 = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    checkpoint = {k: v.detach().clone() for k, v in bf16.state_dict().items()}
    prompts = []
    for q in QUESTIONS:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True
        )
        prompts.append(list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids))
    print("scale  head-only  trunk-only  total   (mean |d|, nats)")
    for scale in args.scales:
        sd = checkpoint if scale == 0 else perturbed(checkpoint, scale, 0)
        bf16.load_state_dict(sd)
        fp32.load_state_dict({k: v.float() for k, v in sd.items()})
        head, trunk, total = [], [], []
        with torch.no_grad():
            for prompt in prompts:
                seq = bf16.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[
                    0
                ].tolist()
                ids, start = torch.tensor([seq]), len(prompt)
                h16 = bf16.get_decoder()(ids).last_hidden_state[0]
                h32 = fp32.get_decoder()(ids).last_hidden_state[0]
                w = fp32.get_output_embeddings().weight
                a = _picked(bf16.get_output_embeddings()(h16), seq, start)
                b = _picked(h16.float() @ w.T, seq, start)
                c = _picked(h32 @ w.T, seq, start)
                head.append((a - b).abs())
                trunk.append((b - c).abs())
                total.append((a - c).abs())
        mean = lambda xs: float(torch.cat(xs).mean())  # noqa: E731
        print(f"{scale:<6} {mean(head):.4f}     {mean(trunk):.4f}      {mean(total):.4f}")


if __name__ == "__main__":
    main()
