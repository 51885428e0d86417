"""Synthetic evidence for check and baseline unit tests: same keys and layout as the worker writes."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.util
import json
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import numpy as np

from gate.contract import evidence as ev
from gate.contract import keys

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
EFFECTIVE = {
    "logprobs_mode": "processed_logprobs",
    "enable_prefix_caching": False,
    "async_scheduling": False,
    "dtype": "float32",
    "compilation_mode": "VLLM_COMPILE",
    "model_runner": "V1",
}


def make_evidence(
    folder: Path,
    n_prompts: int = 20,
    n: int = 2,
    length: int = 8,
    seed: int = 0,
    engine_offset: float = 0.0,
    engine_noise: float = 0.0,
    engine_equals: str = "processed",
    tf_offset: float = 0.0,
    effective: dict | None = None,
    prompt_tokens: list[list[int]] | None = None,
    greedy_tokens: np.ndarray | None = None,
    weight_sync: str | None = "ok",
    inflight: str | None = "ok",
    grpo: str | None = "ok",
    token_text: dict[int, str] | None = None,
    batch_variance: float | None = 0.0,
) -> ev.Evidence:
    """One engine's evidence; the engine's sampled logprob equals the trainer's `engine_equals` one
    (processed / raw / bf16) plus ``engine_offset`` and Gaussian ``engine_noise``. ``token_text``
    goes into texts.json as the worker records it (None: left out, as older evidence has it).
    ``batch_variance``: the largest |Δ| of the batch-invariance pass (None: the pass did not run)."""
    rng = np.random.default_rng(seed)
    s = n_prompts * n
    offsets = np.arange(s + 1, dtype=np.int64) * length
    t = s * length
    raw = -rng.uniform(0.05, 3.0, t).astype(np.float32)
    processed = (raw / 0.7).astype(np.float32)  # a stand-in for the temperature transform
    bf16 = (raw + rng.normal(0, 0.01, t)).astype(np.float32)
    base = {"processed": processed, "raw": raw}[engine_equals]
    engine = (base + engine_offset + rng.normal(0, engine_noise, t) * (engine_noise > 0)).astype(
        np.float32
    )
    prompts = prompt_tokens or [[1, 10 + p % 7, 20 + p % 5] for p in range(n_prompts)]
    greedy = (
        greedy_tokens
        if greedy_tokens is not None
        else np.tile(np.arange(4, dtype=np.int32), n_prompts)
    )
    tf_ids = np.concatenate(
        [np.asarray(prompts[p] + [5, 6, 7], dtype=np.int32) for p in range(n_prompts)]
    )
    tf_in_off = np.concatenate([[0], np.cumsum([len(prompts[p]) + 3 for p in range(n_prompts)])])
    tf_t = int(tf_in_off[-1]) - n_prompts
    # Fixed sequences through the same model: identical across engines unless tf_offset says otherwise.
    tf_trainer = -np.random.default_rng(1234).uniform(0.05, 3.0, tf_t).astype(np.float32)
    arrays = {
        keys.PROMPT_OFFSETS: np.concatenate([[0], np.cumsum([len(p) for p in prompts])]).astype(
            np.int64
        ),
        keys.PROMPT_TOKEN_IDS: np.concatenate([np.asarray(p, dtype=np.int32) for p in prompts]),
        "sample_prompt_index": np.repeat(np.arange(n_prompts), n).astype(np.int32),
        "sample_sample_index": np.tile(np.arange(n), n_prompts).astype(np.int32),
        "sample_offsets": offsets,
        **_top_lists(rng, engine, t),
        "sample_finish": np.zeros(s, dtype=np.int8),
        "sample_trainer_logprob_raw": raw,
        "sample_trainer_logprob_processed": processed,
        "sample_trainer_logprob_raw_bf16_head": bf16,
        "greedy_prompt_index": np.arange(n_prompts, dtype=np.int32),
        "greedy_offsets": np.arange(n_prompts + 1, dtype=np.int64) * 4,
        "greedy_token_ids": greedy.astype(np.int32),
        "greedy_engine_logprob": np.full(n_prompts * 4, -0.1, dtype=np.float32),
        "tf_prompt_index": np.arange(n_prompts, dtype=np.int32),
        "tf_input_offsets": tf_in_off.astype(np.int64),
        "tf_input_ids": tf_ids,
        "tf_offsets": np.concatenate(
            [[0], np.cumsum([len(prompts[p]) + 2 for p in range(n_prompts)])]
        ).astype(np.int64),
        "tf_engine_logprob": (tf_trainer + tf_offset).astype(np.float32),
        "tf_trainer_logprob_raw": tf_trainer,
        "tf_trainer_logprob_raw_bf16_head": (tf_trainer + 0.02).astype(np.float32),
        "tf_is_reference": np.ones(tf_t, dtype=bool),
    }
    if weight_sync is not None:
        arrays.update(_weight_sync_arrays(weight_sync, rng))
    if weight_sync is not None and inflight is not None:
        arrays.update(_inflight_arrays(rng))
    if grpo is not None:
        arrays.update(_grpo_arrays(grpo, seed))
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "evidence.npz", **arrays)
    meta = {
        "identity": {
            "vllm": "0.32.0",
            "engine_generation": "V1",
            "device_kind": "cpu",
            "device_name": "cpu",
            "transformers": "5",
        },
        "effective": {**EFFECTIVE, **(effective or {})},
        "default_sampling_params": {"temperature": 1.0, "repetition_penalty": 1.0},
        "generation_config_overrides": {},
        "dropped_engine_args": [],
        "weight_sync": {
            "adapter": "collective_rpc reload_weights + reset_prefix_cache",
            "push_s": 0.05,
        },
    }
    if weight_sync is not None and inflight is not None:
        meta["weight_sync_inflight"] = {"adapter": meta["weight_sync"]["adapter"], "max_tokens": 8,
                                        "updates": [{"name": "keep", "builtin": True, "error": None}]}  # fmt: skip
    if batch_variance is not None:
        meta["batch_invariance"] = {
            "mode": False,
            "sequences": n_prompts,
            "tokens": t,
            "bitwise": batch_variance == 0,
            "max_abs_diff": {"reversed": batch_variance / 2, "one at a time": batch_variance},
        }
    (folder / "engine.json").write_text(json.dumps(meta))
    texts = {"prompt_ids": [f"p{i}" for i in range(n_prompts)], "greedy_text": ["t"] * n_prompts}
    if token_text is not None:
        texts[ev.TOKEN_TEXT] = {str(k): v for k, v in token_text.items()}
    (folder / "texts.json").write_text(json.dumps(texts))
    return ev.load(folder)


def script(name: str) -> ModuleType:
    """scripts/<name>.py imported as a module (research code the package does not ship)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def with_engine(e: ev.Evidence, **fields) -> ev.Evidence:
    """``e`` with engine.json's top-level ``fields`` replaced (a hand-made record, as a worker of
    another release or a corrupted file would have it); returns ``e``."""
    e.engine = dataclasses.replace(e.engine, **fields)
    return e


def with_identity(e: ev.Evidence, **fields) -> ev.Evidence:
    """``e`` with engine.json's ``identity`` fields replaced; returns ``e``."""
    return with_engine(e, identity=dataclasses.replace(e.engine.identity, **fields))


RUN = {
    "model": {"sha256": "a" * 64, "path": "/m"},
    "prompt_sets": [{"name": "arith", "sha256": "b" * 64, "records": 20, "file": "x"}],
    "sampling": {
        "n": 2,
        "max_tokens": 8,
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": 0,
        "seed": 1,
        "logprobs": 5,
    },
    "greedy": {"enabled": True, "max_tokens": 4},
    "teacher_forced": {"enabled": True},
    "reference": {"dtype": "float32", "lm_head_fp32": False, "batch_tokens": 16384},
}


def _top_lists(rng: np.random.Generator, engine: np.ndarray, t: int) -> dict[str, np.ndarray]:
    """Sampled ids and well-formed top-5 lists: the sampled token first (rank 1, its own logprob),
    four distinct other ids below it (logprob-integrity reads them)."""
    token = rng.integers(3, 100, t).astype(np.int32)
    rng.integers(3, 100, (t, 5))  # kept: later draws (weight sync, in-flight) stay as they were
    steps = rng.uniform(0, 5, (t, 5))[:, 1:] + 1e-3
    ids = 3 + (token[:, None] - 3 + np.arange(5)[None, :]) % 97
    values = engine[:, None] - np.concatenate([np.zeros((t, 1)), np.cumsum(steps, axis=1)], axis=1)
    return {
        "sample_token_ids": token,
        "sample_engine_logprob": engine,
        "sample_engine_rank": np.ones(t, dtype=np.int32),
        "sample_topk_ids": ids.astype(np.int32),
        "sample_topk_logprobs": values.astype(np.float32),
    }


def _weight_sync_arrays(mode: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """8 control + 8 prefix probes of 4 tokens; the engine matches the new weights unless ``mode`` breaks it.
    The second push of the same weights leaves it there, except in ``second-update`` (and ``no-second``
    is evidence from before the second push was recorded)."""
    t = 64
    is_prefix = np.repeat([False, True], t // 2)
    new = -rng.uniform(0.1, 2.0, t).astype(np.float32)
    old = (new - rng.uniform(0.2, 0.5, t)).astype(np.float32)  # clearly different weights
    engine = new.copy()
    if mode == "stale":
        engine = old.copy()
    elif mode == "partial":
        engine = (new + 0.3).astype(np.float32)
    elif mode == "stale-cache":
        engine[is_prefix] = old[is_prefix]
    before = -rng.uniform(0.1, 2.0, t).astype(np.float32)
    again = engine.copy() if mode != "second-update" else (new + 0.4).astype(np.float32)
    second = {
        keys.WS_AGAIN_IS_PREFIX: is_prefix,
        keys.WS_AGAIN_TOKEN_IDS: rng.integers(3, 100, t).astype(np.int32),
        keys.WS_AGAIN_ENGINE_LOGPROB: again,
        keys.WS_AGAIN_TRAINER_NEW_LOGPROB: new,
    }
    return ({} if mode == "no-second" else second) | {
        keys.WS_IS_PREFIX: is_prefix,
        keys.WS_OFFSETS: np.arange(17, dtype=np.int64) * 4,
        keys.WS_TOKEN_IDS: rng.integers(3, 100, t).astype(np.int32),
        keys.WS_ENGINE_LOGPROB: engine,
        keys.WS_TRAINER_NEW_LOGPROB: new,
        keys.WS_TRAINER_OLD_LOGPROB: old,
        keys.WS_BEFORE_IS_PREFIX: is_prefix,
        keys.WS_BEFORE_ENGINE_LOGPROB: (before + 1e-6).astype(np.float32),
        keys.WS_BEFORE_TRAINER_LOGPROB: before,
    }


def _inflight_arrays(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One ``keep`` update over 4 requests of 8 tokens, the switch after 3: OLD, then STALE."""
    old = -rng.uniform(0.1, 2.0, 32).astype(np.float32)
    j = np.tile(np.arange(8), 4)
    stale = np.where(j < 3, old, old - 0.3).astype(np.float32)
    return {
        keys.WSI_OFFSETS: np.arange(5, dtype=np.int64) * 8,
        keys.WSI_UPDATE_INDEX: np.zeros(4, dtype=np.int64),
        keys.WSI_TOKEN_IDS: rng.integers(3, 100, 32).astype(np.int64),
        keys.WSI_ENGINE_LOGPROB: stale.copy(),
        keys.WSI_OLD_LOGPROB: old,
        keys.WSI_REC_LOGPROB: (old - 0.6).astype(np.float32),
        keys.WSI_STALE_LOGPROB: stale,
        keys.WSI_SWITCH_START: np.full(4, 3, dtype=np.int64),
        keys.WSI_SWITCH_END: np.full(4, 3, dtype=np.int64),
        keys.WSI_FINISH: np.ones(4, dtype=np.int64),
        keys.WSI_ABORTED_AT: np.full(4, -1, dtype=np.int64),
        keys.WSI_RESUBMITTED_AT: np.full(4, -1, dtype=np.int64),
    }


# The GRPO runs make_evidence builds: seeds per run (at least grpo-trajectory's MIN_NULL_SEEDS, so an
# old engine's run is a null with power), steps per seed and eval prompts.
GRPO_SEEDS, GRPO_STEPS, GRPO_EVAL = 16, 6, 8


def _grpo_arrays(mode: str, seed: int, seeds: int = GRPO_SEEDS) -> dict[str, np.ndarray]:
    """A run of ``seeds`` seeds as the worker records it; each seed's numbers drawn around a clean
    run's (reward rising, mismatch ~0, an fp32 engine), the draws set by ``seed``. Modes:
    ``raw``: mismatch from step 0, flat; ``drift``: k3 doubles every step; ``identical``: every
    group one completion; ``learn_less``: the trained policy's eval reward 0.15 lower."""
    rng = np.random.default_rng(1000 + seed)
    steps = GRPO_STEPS
    t = np.arange(steps)[None, :]
    k3 = np.full((seeds, steps), 1e-13)
    clip = np.zeros((seeds, steps))
    if mode == "raw":
        k3, clip = np.full((seeds, steps), 4e-3), np.full((seeds, steps), 0.04)
    elif mode == "drift":
        k3 = 1e-4 * 2.0**t * np.exp(rng.normal(0, 0.1, (seeds, steps)))
    identical = rng.binomial(8, 0.05, (seeds, steps)) / 8
    if mode == "identical":
        identical = np.ones((seeds, steps))
    out = {
        "reward": 0.3 + 0.05 * t + rng.normal(0, 0.05, (seeds, steps)),
        "k3_kl": k3, "clip_frac": clip,
        "entropy": 0.5 - 0.01 * t + rng.normal(0, 0.01, (seeds, steps)),
        "mean_abs_diff": np.sqrt(2 * k3), "token_mult_prob_error": 1 + np.sqrt(2 * k3),
        "response_length": np.full((seeds, steps), 19.0), "identical_groups": identical,
        "step_s": np.full((seeds, steps), 1.0), "push_s": np.full((seeds, steps), 0.05),
    }  # fmt: skip
    se = {
        "reward": np.full((seeds, steps), 0.05),
        "entropy": np.full((seeds, steps), 0.02),
        "response_length": np.full((seeds, steps), 0.5),
    }
    se |= {
        m: 0.1 * np.abs(out[m] - (m == "token_mult_prob_error"))
        for m in ("k3_kl", "clip_frac", "mean_abs_diff", "token_mult_prob_error")
    }
    out |= {f"{m}_se": v for m, v in se.items()}
    arrays = {keys.grpo_key(k): np.asarray(v, dtype=np.float64) for k, v in out.items()}
    per_prompt = np.linspace(-0.2, 0.2, GRPO_EVAL)[None, :]
    learned = 0.45 - (0.15 if mode == "learn_less" else 0.0) + rng.normal(0, 0.03, (seeds, 1))
    arrays |= {
        keys.GRPO_EVAL_PROMPT_INDEX: np.arange(GRPO_EVAL, dtype=np.int64) * 2,
        keys.GRPO_EVAL0_SUCCESS: np.clip(0.4 + per_prompt[0], 0, 1),
        keys.GRPO_EVAL_SUCCESS: np.clip(learned + per_prompt, 0, 1),
    }
    return arrays


def make_wheel(
    folder: Path, name: str, version: str, extra: dict[str, bytes] | None = None
) -> Path:
    """A minimal pure-Python wheel whose module records its own version, with ``extra`` files."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files: dict[str, bytes] = {
        f"{name}.py": f"VERSION = {version!r}\n".encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: gate-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        **(extra or {}),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    files[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name_in_zip, data in files.items():
            zf.writestr(name_in_zip, data)
    return path
