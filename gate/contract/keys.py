"""Every array name ``evidence.npz`` may hold, with the axis its first dimension runs along.

The worker writes these names and the checks read them; both import them from here, so a key is
spelled once. :func:`declared` and :func:`axis_of` are what validation (``gate.contract.evidence``)
and the offline subsetting (``gate.repeat``) ask instead of guessing from a suffix.

Arrays belong to a *pass*: the ragged arrays of one pass share its ``offsets`` (sequence ``i`` owns
``x[offsets[i]:offsets[i + 1]]``), so every TOKEN array of a pass has ``offsets[-1]`` rows and every
SEQUENCE array ``len(offsets) - 1``. Passes without offsets of their own (the weight-sync probe's
before / again / wake generations) only require their TOKEN arrays to agree with each other.
Standard library only: the worker imports this inside each engine environment.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# The layout version of evidence.npz + engine.json. Bump it when a key changes meaning or shape (not
# when an optional key is added): evidence of another version is refused on load with the reason,
# so a cached or baseline run from an incompatible gate is re-made, never misread. Evidence written
# before the version was recorded has this layout and reads as 1.
EVIDENCE_SCHEMA_VERSION = 1


class Axis(enum.Enum):
    """What the first dimension of an array counts."""

    OFFSETS = "offsets"  # n + 1 boundaries of a pass's sequences (or of the prompts)
    PROMPT_TOKEN = "prompt token"  # every prompt's token ids, concatenated
    SEQUENCE = "sequence"  # one row per sequence of the pass
    TOKEN = "token"  # one row per generated (or scored) token of the pass; [T] or [T, k]
    INPUT_OFFSETS = "input offsets"  # teacher-forced sequences' boundaries over their input ids
    INPUT_TOKEN = "input token"  # teacher-forced sequences' input ids, concatenated
    SEED_STEP = "seed x step"  # GRPO: [seeds, steps]
    SEED_EVAL = "seed x eval prompt"  # GRPO: [seeds, eval prompts], the trained policy's eval
    EVAL_PROMPT = (
        "eval prompt"  # GRPO: [eval prompts], the held-out set and the step-0 policy's eval
    )


@dataclass(frozen=True)
class Key:
    """One declared array: its name in evidence.npz, its pass and its axis."""

    name: str
    passname: str
    axis: Axis


# -- passes ----------------------------------------------------------------------------------------
PROMPTS = "prompt"
SAMPLE = "sample"  # the rollout pass: n samples per prompt at the configured transform
GREEDY = "greedy"  # temperature 0, one sample per prompt
TF = "tf"  # teacher-forced fixed sequences (prompt + reference) through prompt_logprobs
WS = "ws"  # the weight-sync probe, after the push
WS_BEFORE = "ws_before"  # ... before it
WS_AGAIN = "ws_again"  # ... after the same weights are pushed a second time
WS_WAKE = "ws_wake"  # ... after a sleep / wake cycle
WS_BASE = "ws_base"  # LoRA mode: the base model, no adapter, before the first adapter version
WSI = "wsi"  # in-flight updates: one sequence per request per update
GRPO = "grpo"  # the mini GRPO run's per-step metrics

# -- prompts ---------------------------------------------------------------------------------------
PROMPT_OFFSETS = "prompt_offsets"
PROMPT_TOKEN_IDS = "prompt_token_ids"

# -- suffixes of the completion passes (sample_, greedy_) and the teacher-forced pass (tf_) ---------
PROMPT_INDEX = "prompt_index"
SAMPLE_INDEX = "sample_index"
OFFSETS = "offsets"
TOKEN_IDS = "token_ids"
ENGINE_LOGPROB = "engine_logprob"
ENGINE_RANK = "engine_rank"
TOPK_IDS = "topk_ids"
TOPK_LOGPROBS = "topk_logprobs"
FINISH = "finish"
TRAINER_RAW = "trainer_logprob_raw"
TRAINER_PROCESSED = "trainer_logprob_processed"
TRAINER_RAW_BF16_HEAD = "trainer_logprob_raw_bf16_head"
# The sampled token lies within one ULP of the top-k/top-p boundary (engine dtype): undecidable.
TRAINER_AT_BOUNDARY = "trainer_at_boundary"
# The smallest logit top-k/top-p keeps minus the token's (> 0: outside the transform; NaN: none
# applies): how far outside the nucleus the reference puts a sampled token.
TRAINER_BOUNDARY_GAP = "trainer_boundary_gap"
# The probability (after temperature and top-k) of the tokens more likely than the sampled one:
# top-p keeps a token while it is < top_p. NaN where top-p is off.
TRAINER_MASS_ABOVE = "trainer_mass_above"
# The reference's log_softmax(logits / T) over the whole vocabulary: what a trainer that does not
# renormalise over the sampler's kept tokens computes; minus the processed logprob, the log of the
# kept mass (support-mismatch, in train-inference-mismatch).
TRAINER_TEMPERED = "trainer_logprob_tempered"
# The reference's raw logprobs of the engine's top-k tokens ([tokens, k], NaN where the engine
# reported fewer): the effective-temperature fit.
TRAINER_TOPK_RAW = "trainer_topk_raw"
# With penalties on, the fit's inputs are after the penalties, before temperature: the reference's
# logprobs of the engine's top-k ([tokens, k]) and of the sampled token ([tokens]), in place of
# trainer_topk_raw and trainer_logprob_raw.
TRAINER_TOPK_PENALISED = "trainer_topk_penalised"
TRAINER_PENALISED = "trainer_logprob_penalised"
# The engine's own prefill logprob of each greedy token: the greedy sequence scored again as a
# prompt in the same engine (NaN: not rescored).
PREFILL_LOGPROB = "prefill_logprob"
# Per sampled sequence (gate.worker.replay.text_round_trip): the engine's text is not the
# tokenizer's decoding of its ids; and where encoding that text again first departs from the ids
# (-1: it gives them back).
TEXT_MISMATCH = "text_mismatch"
RETOKENIZED_AT = "retokenized_at"
# Teacher-forced only: the full sequences, and which scored positions belong to the reference.
INPUT_OFFSETS = "input_offsets"
INPUT_IDS = "input_ids"
IS_REFERENCE = "is_reference"

FINISH_NAMES = ("stop", "length", "abort", "other")

_COMPLETION_SUFFIXES: dict[str, Axis] = {
    PROMPT_INDEX: Axis.SEQUENCE, SAMPLE_INDEX: Axis.SEQUENCE, OFFSETS: Axis.OFFSETS,
    FINISH: Axis.SEQUENCE, TEXT_MISMATCH: Axis.SEQUENCE, RETOKENIZED_AT: Axis.SEQUENCE,
    TOKEN_IDS: Axis.TOKEN, ENGINE_LOGPROB: Axis.TOKEN, ENGINE_RANK: Axis.TOKEN, TOPK_IDS: Axis.TOKEN,
    TOPK_LOGPROBS: Axis.TOKEN, TRAINER_RAW: Axis.TOKEN, TRAINER_PROCESSED: Axis.TOKEN,
    TRAINER_RAW_BF16_HEAD: Axis.TOKEN, TRAINER_AT_BOUNDARY: Axis.TOKEN,
    TRAINER_BOUNDARY_GAP: Axis.TOKEN, TRAINER_MASS_ABOVE: Axis.TOKEN, TRAINER_TEMPERED: Axis.TOKEN,
    TRAINER_TOPK_RAW: Axis.TOKEN, TRAINER_TOPK_PENALISED: Axis.TOKEN, TRAINER_PENALISED: Axis.TOKEN,
    PREFILL_LOGPROB: Axis.TOKEN,
}  # fmt: skip
_TF_SUFFIXES: dict[str, Axis] = {
    PROMPT_INDEX: Axis.SEQUENCE, INPUT_OFFSETS: Axis.INPUT_OFFSETS, INPUT_IDS: Axis.INPUT_TOKEN,
    OFFSETS: Axis.OFFSETS, ENGINE_LOGPROB: Axis.TOKEN, TRAINER_RAW: Axis.TOKEN,
    TRAINER_RAW_BF16_HEAD: Axis.TOKEN, IS_REFERENCE: Axis.TOKEN,
}  # fmt: skip


def pass_key(passname: str, suffix: str) -> str:
    """``sample`` + ``engine_logprob`` -> ``sample_engine_logprob``."""
    return f"{passname}_{suffix}"


# -- the weight-sync probe (gate/worker/weight_sync.py) ----------------------------------------------
WS_OFFSETS = "ws_offsets"
WS_TOKEN_IDS = "ws_token_ids"
WS_IS_PREFIX = "ws_is_prefix"  # the token belongs to a probe behind the shared multi-block prefix
WS_ENGINE_LOGPROB = "ws_engine_logprob"
WS_TRAINER_NEW_LOGPROB = "ws_trainer_new_logprob"
WS_TRAINER_OLD_LOGPROB = "ws_trainer_old_logprob"
WS_BEFORE_IS_PREFIX = "ws_before_is_prefix"
WS_BEFORE_ENGINE_LOGPROB = "ws_before_engine_logprob"
WS_BEFORE_TRAINER_LOGPROB = "ws_before_trainer_logprob"
WS_AGAIN_IS_PREFIX = "ws_again_is_prefix"
WS_AGAIN_TOKEN_IDS = "ws_again_token_ids"
WS_AGAIN_ENGINE_LOGPROB = "ws_again_engine_logprob"
WS_AGAIN_TRAINER_NEW_LOGPROB = "ws_again_trainer_new_logprob"
WS_WAKE_IS_PREFIX = "ws_wake_is_prefix"
WS_WAKE_ENGINE_LOGPROB = "ws_wake_engine_logprob"
WS_WAKE_TRAINER_NEW_LOGPROB = "ws_wake_trainer_new_logprob"
# LoRA mode (gate/worker/lora_sync.py): the base model's greedy probes, and the first adapter
# version's tokens scored by the trainer under each alternative way of applying it, [T, H], in the
# order of engine.json weight_sync.lora.alternatives (the diagnosis of the lora-adapter check).
WS_BASE_IS_PREFIX = "ws_base_is_prefix"
WS_BASE_ENGINE_LOGPROB = "ws_base_engine_logprob"
WS_BASE_TRAINER_LOGPROB = "ws_base_trainer_logprob"
WS_BEFORE_TRAINER_ALT_LOGPROB = "ws_before_trainer_alt_logprob"

_WS_KEYS: dict[str, tuple[str, Axis]] = {
    WS_OFFSETS: (WS, Axis.OFFSETS), WS_TOKEN_IDS: (WS, Axis.TOKEN), WS_IS_PREFIX: (WS, Axis.TOKEN),
    WS_ENGINE_LOGPROB: (WS, Axis.TOKEN), WS_TRAINER_NEW_LOGPROB: (WS, Axis.TOKEN),
    WS_TRAINER_OLD_LOGPROB: (WS, Axis.TOKEN),
    WS_BEFORE_IS_PREFIX: (WS_BEFORE, Axis.TOKEN), WS_BEFORE_ENGINE_LOGPROB: (WS_BEFORE, Axis.TOKEN),
    WS_BEFORE_TRAINER_LOGPROB: (WS_BEFORE, Axis.TOKEN),
    WS_AGAIN_IS_PREFIX: (WS_AGAIN, Axis.TOKEN), WS_AGAIN_TOKEN_IDS: (WS_AGAIN, Axis.TOKEN),
    WS_AGAIN_ENGINE_LOGPROB: (WS_AGAIN, Axis.TOKEN),
    WS_AGAIN_TRAINER_NEW_LOGPROB: (WS_AGAIN, Axis.TOKEN),
    WS_WAKE_IS_PREFIX: (WS_WAKE, Axis.TOKEN), WS_WAKE_ENGINE_LOGPROB: (WS_WAKE, Axis.TOKEN),
    WS_WAKE_TRAINER_NEW_LOGPROB: (WS_WAKE, Axis.TOKEN),
    WS_BASE_IS_PREFIX: (WS_BASE, Axis.TOKEN), WS_BASE_ENGINE_LOGPROB: (WS_BASE, Axis.TOKEN),
    WS_BASE_TRAINER_LOGPROB: (WS_BASE, Axis.TOKEN),
    WS_BEFORE_TRAINER_ALT_LOGPROB: (WS_BEFORE, Axis.TOKEN),
}  # fmt: skip

# -- in-flight updates (gate/worker/inflight.py; docs/evidence.md says what each holds) ------------
WSI_OFFSETS = "wsi_offsets"
WSI_TOKEN_IDS = "wsi_token_ids"
WSI_ENGINE_LOGPROB = "wsi_engine_logprob"  # NaN where the engine returned none
# The trainer's logprob of each token under the old weights, the new ones from the switch on
# (recomputed: REC) and the new ones over a KV cache computed with the old (STALE).
WSI_OLD_LOGPROB = "wsi_old_logprob"
WSI_REC_LOGPROB = "wsi_rec_logprob"
WSI_STALE_LOGPROB = "wsi_stale_logprob"
WSI_UPDATE_INDEX = "wsi_update_index"
WSI_SWITCH_START = "wsi_switch_start"
WSI_SWITCH_LOWER = "wsi_switch_lower"
WSI_SWITCH_UPPER = "wsi_switch_upper"
WSI_SWITCH_END = "wsi_switch_end"
WSI_FINISH = "wsi_finish"
WSI_ABORTED_AT = "wsi_aborted_at"
WSI_RESUBMITTED_AT = "wsi_resubmitted_at"
WSI_VERSION_SWITCH = "wsi_version_switch"

_WSI_KEYS: dict[str, Axis] = {
    WSI_OFFSETS: Axis.OFFSETS, WSI_TOKEN_IDS: Axis.TOKEN, WSI_ENGINE_LOGPROB: Axis.TOKEN,
    WSI_OLD_LOGPROB: Axis.TOKEN, WSI_REC_LOGPROB: Axis.TOKEN, WSI_STALE_LOGPROB: Axis.TOKEN,
    WSI_UPDATE_INDEX: Axis.SEQUENCE, WSI_SWITCH_START: Axis.SEQUENCE,
    WSI_SWITCH_LOWER: Axis.SEQUENCE, WSI_SWITCH_UPPER: Axis.SEQUENCE, WSI_SWITCH_END: Axis.SEQUENCE,
    WSI_FINISH: Axis.SEQUENCE, WSI_ABORTED_AT: Axis.SEQUENCE, WSI_RESUBMITTED_AT: Axis.SEQUENCE,
    WSI_VERSION_SWITCH: Axis.SEQUENCE,
}  # fmt: skip

# -- the mini GRPO run (gate/worker/grpo.py): ``grpo_<metric>`` and ``grpo_<metric>_se``, [seeds, steps]
GRPO_METRICS = ("reward", "k3_kl", "clip_frac", "entropy", "mean_abs_diff", "token_mult_prob_error",
                "response_length", "identical_groups", "step_s", "push_s")  # fmt: skip
# Metrics whose per-step standard error is recorded too (the per-step charts' band margins).
GRPO_WITH_SE = ("reward", "k3_kl", "clip_frac", "entropy", "mean_abs_diff",
                "token_mult_prob_error", "response_length")  # fmt: skip
# Timings, not dynamics: recorded per step, never judged.
GRPO_TIMINGS = ("step_s", "push_s")


def grpo_key(metric: str) -> str:
    """The array of ``metric`` (one of :data:`GRPO_METRICS`), [seeds, steps]."""
    return f"{GRPO}_{metric}"


def grpo_se_key(metric: str) -> str:
    """The per-step standard error of ``metric`` (one of :data:`GRPO_WITH_SE`), [seeds, steps]."""
    return f"{GRPO}_{metric}_se"


# The held-out eval set: which prompts (indices into the request's prompt list) it holds, the
# step-0 policy's success rate on each, and each seed's trained policy's success rate on each.
GRPO_EVAL_PROMPT_INDEX = "grpo_eval_prompt_index"  # [eval prompts]
GRPO_EVAL0_SUCCESS = "grpo_eval0_success"  # [eval prompts]: the checkpoint, sampled by this engine
GRPO_EVAL_SUCCESS = (
    "grpo_eval_success"  # [seeds, eval prompts]: each seed's policy after the last step
)
_GRPO_EVAL_KEYS = {
    GRPO_EVAL_PROMPT_INDEX: Axis.EVAL_PROMPT,
    GRPO_EVAL0_SUCCESS: Axis.EVAL_PROMPT,
    GRPO_EVAL_SUCCESS: Axis.SEED_EVAL,
}

GRPO_REWARD = grpo_key("reward")


def _declare() -> dict[str, Key]:
    keys = [
        Key(PROMPT_OFFSETS, PROMPTS, Axis.OFFSETS),
        Key(PROMPT_TOKEN_IDS, PROMPTS, Axis.PROMPT_TOKEN),
    ]
    for passname in (SAMPLE, GREEDY):
        keys += [Key(pass_key(passname, s), passname, a) for s, a in _COMPLETION_SUFFIXES.items()]
    keys += [Key(pass_key(TF, s), TF, a) for s, a in _TF_SUFFIXES.items()]
    keys += [Key(name, passname, a) for name, (passname, a) in _WS_KEYS.items()]
    keys += [Key(name, WSI, a) for name, a in _WSI_KEYS.items()]
    keys += [Key(grpo_key(m), GRPO, Axis.SEED_STEP) for m in GRPO_METRICS]
    keys += [Key(grpo_se_key(m), GRPO, Axis.SEED_STEP) for m in GRPO_WITH_SE]
    keys += [Key(name, GRPO, a) for name, a in _GRPO_EVAL_KEYS.items()]
    return {k.name: k for k in keys}


DECLARED: dict[str, Key] = _declare()
PASSES = (PROMPTS, SAMPLE, GREEDY, TF, WS, WS_BEFORE, WS_AGAIN, WS_WAKE, WS_BASE, WSI, GRPO)


def declared(name: str) -> Key | None:
    """The declaration of ``name``, or None where this schema has no such array."""
    return DECLARED.get(name)


def axis_of(name: str) -> Axis:
    """The axis of a declared array; KeyError names an undeclared one."""
    key = DECLARED.get(name)
    if key is None:
        raise KeyError(f"{name}: not an evidence key of schema {EVIDENCE_SCHEMA_VERSION}")
    return key.axis


def keys_of(passname: str) -> tuple[Key, ...]:
    """Every declared array of one pass."""
    return tuple(k for k in DECLARED.values() if k.passname == passname)
