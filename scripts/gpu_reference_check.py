"""The trainer side of the gate on a CUDA GPU: the reference scorer and the GRPO trainer, checked
against what the same code computed on a CPU.

vLLM is not needed (a machine lent for minutes with CUDA torch and transformers is enough); the
engine's part comes from a gate run made elsewhere. What it checks, each as one line and one entry
of the JSON it writes:

1. **The reference on CUDA equals the CPU's.** A gate run's own engine tokens (``--evidence``: an
   ``engines/<name>`` folder of a run on the tiny default) are scored again with
   ``ReferenceModel`` in fp32 on this GPU and this CPU, and compared with the logprobs the run's
   CPU reference recorded (raw and processed).
2. **TF32 cannot reach the fp32 reference.** With TF32 turned on the old way
   (``torch.set_float32_matmul_precision("high")``, what ``VLLM_FLOAT32_MATMUL_PRECISION=high``
   does) and the new way (``torch.backends.cuda.matmul.fp32_precision = "tf32"``), the reference's
   scores equal the fp32 ones, while the same forward outside ``full_fp32_matmul`` moves them.
3. **A SmolLM2-shaped model** (its published dimensions: 49,152 tokens, 30 layers, a tied head;
   random weights, made here): fp32 against a bf16 trunk with an fp32 head on the GPU, the same
   model spread over the GPU and the CPU by accelerate (``reference.device_map``), and scoring
   throughput beside a bare transformers forward and log_softmax over the same tokens.
4. **GRPO on CUDA**: ``run_grpo`` trains the tiny model for a few steps on the GPU; the rollout is
   transformers' sampling from a second copy that every push loads (no vLLM here), so at every step
   the trainer's logprobs and the rollout's differ only by the GPU's arithmetic; in fp32 and bf16.

Usage (from the repository root, on a machine with a CUDA GPU):

    python scripts/gpu_reference_check.py --evidence RUN/engines/new --out gpu_check.json

Exit 0 when every bound holds, 1 when one does not (the line says which), 2 without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gate.contract import evidence as ev  # noqa: E402
from gate.contract.request import WorkerRequest  # noqa: E402
from gate.worker.grpo import run_grpo  # noqa: E402
from gate.worker.reference import ReferenceModel, SamplingTransform  # noqa: E402

TINY = REPO / "gate" / "assets" / "models" / "tiny-arith"
# SmolLM2-135M-Instruct's config (the converted model's config.json), with random weights.
SMOLLM2_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                     rope_theta=100000.0, max_position_embeddings=8192, rms_norm_eps=1e-5)  # fmt: skip

# Bounds. fp32 on two devices differs by summation order alone: ~1e-6 on logprobs of a few units.
FP32_ACROSS_DEVICES = 1e-4
# TF32 keeps 10 mantissa bits: it moves a logprob by ~1e-3, far above fp32's reordering.
TF32_VISIBLE = 1e-5
# k3 between bf16 sampling (cached decode) and a bf16 full forward of the same weights: ~1e-3 on real
# models (SmolLM2 on CPU: 3e-3); far above it means the trainer and the rollout hold other weights.
BF16_K3 = 2e-2


def _say(line: str) -> None:
    print(line, flush=True)


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def _sequences(
    evidence_dir: Path,
) -> tuple[list[list[int]], list[int], dict[str, np.ndarray], WorkerRequest]:
    request = WorkerRequest.from_json((evidence_dir / "request.json").read_text())
    arrays = dict(np.load(evidence_dir / ev.EVIDENCE_FILE))
    offsets, ids = arrays["prompt_offsets"], arrays["prompt_token_ids"]
    prompts = [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]
    s_off, s_ids = arrays["sample_offsets"], arrays["sample_token_ids"]
    seqs, starts = [], []
    for i, p in enumerate(arrays["sample_prompt_index"].tolist()):
        seqs.append(prompts[p] + s_ids[s_off[i] : s_off[i + 1]].tolist())
        starts.append(len(prompts[p]))
    return seqs, starts, arrays, request


def check_reference_across_devices(evidence_dir: Path, model: Path, device: str) -> dict[str, Any]:
    seqs, starts, arrays, request = _sequences(evidence_dir)
    s = request.sampling
    transform = SamplingTransform(s.temperature, s.top_k, s.top_p, penalties=s.penalties())
    recorded_raw = arrays["sample_trainer_logprob_raw"]
    recorded_processed = arrays["sample_trainer_logprob_processed"]
    found: dict[str, Any] = {"tokens": len(recorded_raw), "sequences": len(seqs)}
    scores = {}
    for where in dict.fromkeys((device, "cpu")):
        ref = ReferenceModel(str(model), "float32", lm_head_fp32=False, device=where)
        scored = ref.score(seqs, starts, transform, request.reference.batch_tokens)
        scores[where] = scored
        found[where] = {"raw_vs_recorded": _max_abs(scored.raw, recorded_raw),
                         "processed_vs_recorded": _max_abs(scored.processed, recorded_processed)}  # fmt: skip
    found["cuda_vs_cpu_here"] = _max_abs(scores[device].raw, scores["cpu"].raw)
    found["ok"] = max(found[device]["raw_vs_recorded"], found[device]["processed_vs_recorded"],
                      found["cuda_vs_cpu_here"]) < FP32_ACROSS_DEVICES  # fmt: skip
    _say(f"[1] reference fp32, {found['tokens']} engine tokens: {device} vs the run's CPU reference "
         f"raw {found[device]['raw_vs_recorded']:.2e} processed {found[device]['processed_vs_recorded']:.2e}; "
         f"cuda vs this CPU {found['cuda_vs_cpu_here']:.2e} -> {'ok' if found['ok'] else 'FAIL'}")  # fmt: skip
    return found


def _unpinned_raw(ref: ReferenceModel, seqs, starts, transform) -> np.ndarray:
    """The reference's forward without ``full_fp32_matmul``: what a process-wide TF32 makes of it."""
    with torch.inference_mode():
        return ref._score_batch(seqs, np.asarray(starts), np.asarray([len(q) - s for q, s in zip(seqs, starts, strict=True)]),
                                transform)[0]  # fmt: skip


def check_tf32_is_kept_out(evidence_dir: Path, model: Path) -> dict[str, Any]:
    seqs, starts, _, request = _sequences(evidence_dir)
    seqs, starts = seqs[:64], starts[:64]
    transform = SamplingTransform(1.0, 0, 1.0)
    ref = ReferenceModel(str(model), "float32", lm_head_fp32=False, device="cuda")
    fp32 = ref.score(seqs, starts, transform, request.reference.batch_tokens).raw
    found: dict[str, Any] = {}
    legacy, per_backend = (
        torch.get_float32_matmul_precision(),
        torch.backends.cuda.matmul.fp32_precision,
    )
    ways = {"legacy_high": lambda: torch.set_float32_matmul_precision("high"),
            "per_backend_tf32": lambda: setattr(torch.backends.cuda.matmul, "fp32_precision", "tf32")}  # fmt: skip
    for name, turn_on in ways.items():
        turn_on()
        try:
            pinned = ref.score(seqs, starts, transform, request.reference.batch_tokens).raw
            found[name] = {"pinned_vs_fp32": _max_abs(pinned, fp32),
                           "unpinned_vs_fp32": _max_abs(_unpinned_raw(ref, seqs, starts, transform), fp32),
                           "after": torch.backends.cuda.matmul.fp32_precision}  # fmt: skip
        finally:
            torch.set_float32_matmul_precision(legacy)
            torch.backends.cuda.matmul.fp32_precision = per_backend
        # The process keeps its own setting: the pin lasts as long as the scoring.
        found[name]["restored"] = found[name]["after"] == "tf32"
    found["ok"] = all(v["pinned_vs_fp32"] == 0.0 and v["unpinned_vs_fp32"] > TF32_VISIBLE and v["restored"]
                      for v in found.values())  # fmt: skip
    for name in ways:
        v = found[name]
        _say(
            f"[2] TF32 on ({name}): reference vs fp32 {v['pinned_vs_fp32']:.2e} (the same forward "
            f"unpinned: {v['unpinned_vs_fp32']:.2e}), the process's setting after: {v['after']}"
        )
    _say(f"[2] -> {'ok' if found['ok'] else 'FAIL'}")
    return found


def _smollm2_shaped(folder: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**SMOLLM2_SHAPE)
    LlamaForCausalLM(config).save_pretrained(folder)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed_score(
    ref: ReferenceModel, seqs, starts, transform, device: str
) -> tuple[np.ndarray, float]:
    ref.score(seqs[:4], starts[:4], transform, 16384)  # warm-up: kernels, allocator
    _sync(device)
    start = time.perf_counter()
    raw = ref.score(seqs, starts, transform, 16384).raw
    _sync(device)
    return raw, time.perf_counter() - start


def _bare_forward_s(folder: Path, seqs: list[list[int]], dtype: torch.dtype, device: str) -> float:
    """transformers' own forward and a full log_softmax over the same tokens, same batches."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    ids = torch.tensor(seqs, device=device)
    with torch.inference_mode():
        model(input_ids=ids[:4]).logits.float().log_softmax(-1)
        _sync(device)
        start = time.perf_counter()
        for chunk in range(0, len(seqs), 64):
            model(input_ids=ids[chunk : chunk + 64]).logits.float().log_softmax(-1)
        _sync(device)
    del model
    return time.perf_counter() - start


def check_smollm2_shape(scratch: Path, device: str, sequences: int) -> dict[str, Any]:
    folder = scratch / "smollm2-shaped"
    _smollm2_shaped(folder)
    rng = np.random.default_rng(0)
    seqs = rng.integers(0, SMOLLM2_SHAPE["vocab_size"], size=(sequences, 256)).tolist()
    starts = [32] * len(seqs)
    scored_tokens = sum(len(q) - s for q, s in zip(seqs, starts, strict=True))
    transform = SamplingTransform(0.8, 0, 0.9)
    found: dict[str, Any] = {"tokens": scored_tokens}
    fp32_ref = ReferenceModel(str(folder), "float32", lm_head_fp32=False, device=device)
    fp32, fp32_s = _timed_score(fp32_ref, seqs, starts, transform, device)
    found["fp32"] = {"tok_per_s": scored_tokens / fp32_s, "head_source": fp32_ref.head_source}
    del fp32_ref
    mixed_ref = ReferenceModel(str(folder), "bfloat16", lm_head_fp32=True, device=device)
    mixed, mixed_s = _timed_score(mixed_ref, seqs, starts, transform, device)
    found["bf16_trunk_fp32_head"] = {"tok_per_s": scored_tokens / mixed_s, "head_dtype": str(mixed_ref.head_dtype),
                                     "vs_fp32_max": _max_abs(mixed, fp32),
                                     "vs_fp32_mean": float(np.mean(np.abs(mixed - fp32)))}  # fmt: skip
    del mixed_ref
    bare_s = _bare_forward_s(folder, seqs, torch.float32, device)
    found["bare_fp32_tok_per_s"] = scored_tokens / bare_s
    if device != "cuda":  # accelerate spreads over a GPU and the CPU
        found["ok"] = found["bf16_trunk_fp32_head"]["vs_fp32_max"] > 0
        _say(f"[3] {device}: {found}")
        return found
    spread_ref = ReferenceModel(str(folder), "float32", lm_head_fp32=False, device="cuda", device_map="auto",
                                max_memory={"0": "300MiB", "cpu": "16GiB"})  # fmt: skip
    spread = spread_ref.score(seqs[:32], starts[:32], transform, 16384).raw
    devices = sorted(set(spread_ref.module_devices.values())) if spread_ref.module_devices else []
    found["spread"] = {"devices": devices, "vs_one_device": _max_abs(spread, fp32[: len(spread)])}
    found["ok"] = (found["spread"]["vs_one_device"] < FP32_ACROSS_DEVICES and len(devices) > 1
                   and found["bf16_trunk_fp32_head"]["vs_fp32_max"] > 0)  # fmt: skip
    _say(f"[3] SmolLM2-shaped, {scored_tokens} tokens: fp32 {found['fp32']['tok_per_s']:,.0f} tok/s "
         f"(bare forward + log_softmax {found['bare_fp32_tok_per_s']:,.0f}), bf16 trunk + fp32 head "
         f"{found['bf16_trunk_fp32_head']['tok_per_s']:,.0f} tok/s, |bf16 - fp32| max "
         f"{found['bf16_trunk_fp32_head']['vs_fp32_max']:.2e} mean {found['bf16_trunk_fp32_head']['vs_fp32_mean']:.2e}; "
         f"spread over {devices} vs one device {found['spread']['vs_one_device']:.2e} -> {'ok' if found['ok'] else 'FAIL'}")  # fmt: skip
    return found


class _GenerateRollout:
    """Sampling by transformers from the engine's copy, as ``Rollout`` (tokens, logprobs, text)."""

    def __init__(self, engine, tokenizer, device: str) -> None:
        self.engine, self.tokenizer, self.device = engine, tokenizer, device

    @torch.inference_mode()
    def __call__(self, prompts, group_size, temperature, max_tokens, seed):
        torch.manual_seed(seed)
        eos = self.tokenizer.eos_token_id
        out = []
        for prompt in prompts:
            ids = torch.tensor([prompt], device=self.device)
            gen = self.engine.generate(ids, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                                       max_new_tokens=max_tokens, num_return_sequences=group_size,
                                       output_scores=True, return_dict_in_generate=True,
                                       pad_token_id=eos if eos is not None else 0)  # fmt: skip
            new = gen.sequences[:, len(prompt) :]
            logprobs = (
                torch.stack(gen.scores, 1)
                .float()
                .log_softmax(-1)
                .gather(-1, new.unsqueeze(-1))
                .squeeze(-1)
            )
            samples = []
            for row in range(group_size):
                tokens = new[row].tolist()
                end = tokens.index(eos) + 1 if eos in tokens else len(tokens)
                samples.append((tokens[:end], logprobs[row, :end].tolist(),
                                self.tokenizer.decode(tokens[:end], skip_special_tokens=True)))  # fmt: skip
            out.append(samples)
        return out


def check_grpo_on_cuda(
    evidence_dir: Path, model: Path, device: str, dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    request = WorkerRequest.from_json((evidence_dir / "request.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(model)
    arrays = dict(np.load(evidence_dir / ev.EVIDENCE_FILE))
    offsets, ids = (
        arrays["prompt_offsets"],
        arrays["prompt_token_ids"],
    )  # as the engine tokenised them
    prompt_ids = [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]
    answers = [p.answer for p in request.prompts]
    engine = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device).eval()
    pushes: list[float] = []

    def push(llm, state_dict):
        start = time.perf_counter()
        llm.load_state_dict(state_dict)
        pushes.append(time.perf_counter() - start)

    grpo = dataclasses.replace(request.grpo, steps=4, seeds=[0])
    run = run_grpo(engine, str(model), prompt_ids, answers, grpo, push, progress=lambda line: _say(f"    {line}"),
                   rollout=_GenerateRollout(engine, tokenizer, device), dtype=dtype)  # fmt: skip
    k3 = run.arrays["grpo_k3_kl"][0].tolist()
    reward = run.arrays["grpo_reward"][0].tolist()
    found = {"k3_kl": k3, "reward": reward, "pushes": len(pushes), "trainer": run.trainer}
    # Rollout and trainer hold one set of weights at every step (each push loads the trainer's), scored
    # by two code paths: fp32 agrees to rounding; bf16 (fp32 masters cast for the push) to bf16's.
    bound = 1e-6 if dtype == torch.float32 else BF16_K3
    found["ok"] = (
        all(math.isfinite(v) for v in k3 + reward)
        and max(k3) < bound
        and len(pushes) == grpo.steps + 2
    )
    k3_text = ", ".join(f"{v:.1e}" for v in k3)
    _say(
        f"[4] GRPO on {device} in {str(dtype).removeprefix('torch.')}, {grpo.steps} steps: k3 {k3_text}, reward {reward}, "
        f"{len(pushes)} pushes -> {'ok' if found['ok'] else 'FAIL'}"
    )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--evidence",
        type=Path,
        required=True,
        help="a gate run's engines/<name> folder (tiny default)",
    )
    parser.add_argument(
        "--model", type=Path, default=TINY, help="the model that run served (default: the tiny one)"
    )
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself")
    parser.add_argument(
        "--sequences", type=int, default=256, help="SmolLM2-shaped sequences of 256 tokens"
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_reference_check: no CUDA device is visible", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    found: dict[str, Any] = {"device": name, "torch": torch.__version__}
    _say(f"{found['device']}, torch {found['torch']}")
    with tempfile.TemporaryDirectory() as scratch:
        checks = {"reference_across_devices": lambda: check_reference_across_devices(args.evidence, args.model, args.device),
                  "tf32_kept_out": lambda: check_tf32_is_kept_out(args.evidence, args.model),
                  "smollm2_shape": lambda: check_smollm2_shape(Path(scratch), args.device, args.sequences),
                  "grpo_on_cuda": lambda: check_grpo_on_cuda(args.evidence, args.model, args.device),
                  "grpo_bf16_on_cuda": lambda: check_grpo_on_cuda(args.evidence, args.model, args.device, torch.bfloat16)}  # fmt: skip
        if args.device != "cuda":
            del checks["tf32_kept_out"]  # TF32 is a GPU's
        for name, check in checks.items():
            start = time.perf_counter()
            try:
                found[name] = check()
            except Exception as exc:  # one broken part must not hide the others' figures
                found[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                _say(f"[{name}] ERROR {found[name]['error']}")
            found[name]["seconds"] = round(time.perf_counter() - start, 1)
    args.out.write_text(json.dumps(found, indent=2, default=str) + "\n")
    return 0 if all(v.get("ok") for v in found.values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
