"""logprob-integrity: are the engine's logprobs finite, and are its top-logprobs lists well formed?

Two regressions that public trackers recorded, neither of which any comparison with a reference
catches reliably:

- **Non-finite logprobs.** prime-rl #2497: an fp32 head sliced to the real vocabulary became a
  strided view, vLLM's top-k/top-p kernel masked whole rows to -inf and the processed logprobs of
  those rows were NaN. An RL loss over a batch holding one NaN logprob is NaN. Every per-token
  engine logprob (sampled, greedy, teacher-forced, the weight-sync probe's) must be finite, and every
  reported top-list value must be finite or -inf (-inf: a token the sampling transform removed).
  Any other value FAILs, with its positions; the checks that compare engine logprobs with a
  reference do not judge such an engine (:func:`engines_with_nonfinite`): their means would be NaN.
- **Malformed top-logprobs lists.** NeMo-RL #3297 / vLLM #36746: Model Runner V2 repeated the
  sampled token in ``top_logprobs``, and callers that took the list's first entry got another
  token's logprob. At each position the list must hold ids inside the vocabulary, no id twice,
  values that never rise down the list, the sampled token's own logprob wherever its id appears,
  and a sampled-token rank that the listed values allow (ties in bf16 logits give a range).

All comparisons are exact: the sampled token's logprob and the list are read from one tensor in
every vLLM release since V1, so a tolerance would only hide the bug.

A third, measured against the engine itself (gate/analysis/prefill_decode.py):

- **Decode against prefill.** NeMo-RL #2100 / #4243: vLLM's decode disagreed with its own prefill
  on 15-20% of sequences. Each greedy sequence is scored again as a prompt in the same engine; a
  sequence whose ``exp(mean |decode - prefill|)`` passes 1.05 disagrees.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gate.analysis.prefill_decode import SEQUENCE_ERROR_BAR, PrefillDecode, compare
from gate.checks.base import (
    CheckResult,
    CheckSettings,
    CheckSpec,
    Limit,
    Measurement,
    Threshold,
    measure,
)
from gate.checks.context import Context
from gate.contract import evidence as ev
from gate.contract import keys
from gate.verdict import Status, worst

ID = "logprob-integrity"
TITLE = "Logprob integrity"

# Per-token engine logprobs, by the evidence key, with what a reader calls them.
ENGINE_LOGPROBS = {
    f"{keys.SAMPLE}_{keys.ENGINE_LOGPROB}": "sampled",
    f"{keys.GREEDY}_{keys.ENGINE_LOGPROB}": "greedy",
    f"{keys.TF}_{keys.ENGINE_LOGPROB}": "teacher-forced",
    keys.WS_BEFORE_ENGINE_LOGPROB: "weight-sync (before the push)",
    keys.WS_ENGINE_LOGPROB: "weight-sync (after the push)",
    keys.WS_AGAIN_ENGINE_LOGPROB: "weight-sync (pushed again)",
    keys.WS_WAKE_ENGINE_LOGPROB: "weight-sync (after sleep and wake)",
}
# Groups whose positions carry a top-logprobs list.
TOP_LIST_GROUPS = (keys.SAMPLE, keys.GREEDY)
SHOWN_POSITIONS = 8  # positions named in the report; the count is always whole

# What a malformed list breaks, worded for the report (kind -> explanation).
KINDS = {
    "out_of_vocabulary": "an id outside the vocabulary",
    "duplicate_ids": "an id listed twice",
    "out_of_order": "a value larger than the one listed before it",
    "sampled_entry_differs": "the sampled token listed with a logprob other than its own",
    "rank_inconsistent": "a sampled-token rank the listed values rule out",
}

THRESHOLDS = {
    "nonfinite_logprobs": Threshold(
        None,
        Limit(0.0),
        source="per-token engine logprobs that are NaN or inf, and top-list values that are NaN or +inf: none in a sound engine",
    ),
    "malformed_top_list_fraction": Threshold(
        Limit(0.0),
        Limit(1e-3),
        source="positions whose top-logprobs list breaks its structure: none in a sound engine; exact comparisons",
    ),
    "prefill_decode_disagreeing_sequences": Threshold(
        Limit(0.0),
        Limit(0.05),
        source=f"greedy sequences whose decode logprobs disagree with the engine's own prefill (exp(mean |Δ|) > "
        f"{SEQUENCE_ERROR_BAR}, NeMo-RL's token_mult_prob_error bar): NeMo-RL #2100 saw 15-20%",
    ),
}


@dataclass(frozen=True)
class ListFindings:
    """Per-position structural faults of one group's top-logprobs lists (boolean arrays over tokens)."""

    faults: dict[str, np.ndarray]
    nonfinite_values: np.ndarray  # a listed value is NaN or +inf

    @property
    def malformed(self) -> np.ndarray:
        out = np.zeros_like(self.nonfinite_values)
        for mask in self.faults.values():
            out |= mask
        return out


def top_list_findings(
    ids: np.ndarray,
    values: np.ndarray,
    token: np.ndarray,
    logprob: np.ndarray,
    rank: np.ndarray | None,
    vocab: int | None,
) -> ListFindings:
    """Structural faults of [tokens, k] top lists; ``ids == -1`` pads a list the engine cut short.

    A rank is consistent when it lies in [1 + listed values above the sampled one, listed values at
    or above it] for a listed token (ties may be broken either way), and is at least 1 + the listed
    values above it for an unlisted one.
    """
    ids = np.asarray(ids, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    token = np.asarray(token, dtype=np.int64)
    logprob = np.asarray(logprob, dtype=np.float64)
    listed = ids != -1
    out_of_vocab = listed & ((ids < 0) | ((ids >= vocab) if vocab is not None else False))
    # Duplicates: sort each row with pads made distinct negatives, compare neighbours.
    k = ids.shape[1]
    keyed = np.where(listed, ids, -2 - np.arange(k)[None, :])
    ordered = np.sort(keyed, axis=1)
    duplicate = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
    # Pads sit at the end with -inf; NaN compares False and is counted as non-finite instead.
    rising = listed[:, 1:] & (values[:, 1:] > values[:, :-1])
    usable = np.isfinite(logprob)  # a NaN logprob is reported as non-finite, not as a list fault
    is_sampled = listed & (ids == token[:, None])
    entry_differs = usable & (is_sampled & (values != logprob[:, None])).any(axis=1)
    faults = {
        "out_of_vocabulary": out_of_vocab.any(axis=1),
        "duplicate_ids": duplicate,
        "out_of_order": rising.any(axis=1),
        "sampled_entry_differs": entry_differs,
    }
    if rank is not None:
        rank = np.asarray(rank, dtype=np.int64)
        above = (listed & (values > logprob[:, None])).sum(axis=1)
        at_or_above = (listed & (values >= logprob[:, None])).sum(axis=1)
        present = is_sampled.any(axis=1)
        faults["rank_inconsistent"] = usable & np.where(
            present, (rank < above + 1) | (rank > at_or_above), rank < above + 1
        )
    nonfinite = (listed & (np.isnan(values) | np.isposinf(values))).any(axis=1)
    return ListFindings(faults, nonfinite)


def nonfinite_positions(e: ev.Evidence) -> dict[str, np.ndarray]:
    """Flat token indices of non-finite engine logprobs, by evidence key (only keys that have any)."""
    found = {}
    for key in ENGINE_LOGPROBS:
        if key in e.arrays:
            bad = np.flatnonzero(~np.isfinite(e.arrays[key]))
            if bad.size:
                found[key] = bad
    return found


def engines_with_nonfinite(ctx) -> list[str]:
    """The engines whose logprobs hold NaN/inf: checks that compare logprobs cannot judge them."""
    return [name for name, e in ctx.engines() if nonfinite_positions(e)]


def _vocab(e: ev.Evidence) -> int | None:
    size = e.engine.reference.get("vocab_size")
    return int(size) if isinstance(size, int) and size > 0 else None


def _where(e: ev.Evidence, group: str, flat: np.ndarray) -> list[str]:
    """'prompt P sample S token T' for the first few flat token indices of a group."""
    offsets = e.arrays.get(f"{group}_{keys.OFFSETS}")
    if offsets is None:
        return [f"token {int(i)}" for i in flat[:SHOWN_POSITIONS]]
    shown = flat[:SHOWN_POSITIONS].tolist()
    seq = (np.searchsorted(offsets, shown, side="right") - 1).tolist()
    return [
        f"{label} token {i - int(offsets[s])}"
        for label, i, s in zip(e.sequence_labels(group, seq), shown, seq, strict=True)
    ]


def _group_of(key: str) -> str:
    return key.rsplit("_engine_logprob", 1)[0]


def _engine_result(name: str, e: ev.Evidence, settings) -> tuple[list[Measurement], dict]:
    bad = nonfinite_positions(e)
    found: dict[str, dict] = {}
    for key, flat in bad.items():
        found[ENGINE_LOGPROBS[key]] = {
            "count": int(flat.size),
            "total": int(e.arrays[key].size),
            "positions": _where(e, _group_of(key), flat),
        }
    kinds = dict.fromkeys(KINDS, 0)
    malformed = positions = 0
    examples: list[str] = []
    for group in TOP_LIST_GROUPS:
        ids = e.arrays.get(f"{group}_{keys.TOPK_IDS}")
        if ids is None or ids.ndim != 2 or ids.shape[1] == 0:
            continue
        lists = top_list_findings(
            ids,
            e[f"{group}_{keys.TOPK_LOGPROBS}"],
            e[f"{group}_{keys.TOKEN_IDS}"],
            e[f"{group}_{keys.ENGINE_LOGPROB}"],
            e.arrays.get(f"{group}_{keys.ENGINE_RANK}"),
            _vocab(e),
        )
        if lists.nonfinite_values.any():
            flat = np.flatnonzero(lists.nonfinite_values)
            found[f"{group} top-list values"] = {
                "count": int(flat.size),
                "total": len(ids),
                "positions": _where(e, group, flat),
            }
        for kind, mask in lists.faults.items():
            kinds[kind] += int(mask.sum())
        bad_rows = np.flatnonzero(lists.malformed)
        malformed += int(bad_rows.size)
        positions += len(ids)
        examples += [f"{group} {w}" for w in _where(e, group, bad_rows)][
            : SHOWN_POSITIONS - len(examples)
        ]
    count = sum(v["count"] for v in found.values())
    t = settings.thresholds
    measurements = [
        measure("nonfinite_logprobs", float(count), t["nonfinite_logprobs"], engine=name)
    ]
    if positions:
        measurements.append(
            measure(
                "malformed_top_list_fraction",
                malformed / positions,
                t["malformed_top_list_fraction"],
                engine=name,
            )
        )
    details = {
        "nonfinite": found,
        "malformed_top_lists": {
            "count": malformed,
            "positions": positions,
            "kinds": {k: v for k, v in kinds.items() if v},
            "examples": examples,
        },
    }
    pd = compare(e)
    if pd is not None and pd.sequences:
        measurements.append(
            measure(
                "prefill_decode_disagreeing_sequences",
                pd.disagreeing_fraction,
                t["prefill_decode_disagreeing_sequences"],
                engine=name,
            )
        )
        details["prefill_decode"] = _prefill_details(e, pd)
    return measurements, details


def _prefill_details(e: ev.Evidence, pd: PrefillDecode) -> dict:
    names = e.texts.get("prompt_ids") if isinstance(e.texts, dict) else None
    prompts = e.arrays.get(f"{keys.GREEDY}_{keys.PROMPT_INDEX}")
    shown = []
    for s in pd.disagreeing[:SHOWN_POSITIONS].tolist():
        p = int(prompts[s]) if prompts is not None and s < len(prompts) else s
        shown.append(names[p] if isinstance(names, list) and p < len(names) else f"#{p}")
    return {
        "sequences": pd.sequences,
        "disagreeing": len(pd.disagreeing),
        "examples": shown,
        "tokens": pd.tokens,
        "not_compared": pd.not_compared,
        "mean_abs_diff": pd.mean_abs,
        "max_abs_diff": pd.max_abs,
        "max_sequence_error": float(pd.sequence_error.max()) if pd.sequences else None,
    }


def run(ctx: Context, settings: CheckSettings) -> CheckResult:
    measurements: list[Measurement] = []
    details: dict[str, dict] = {}
    for name, e in ctx.engines():
        m, d = _engine_result(name, e, settings)
        measurements += m
        details[name] = d
    status = worst(m.status for m in measurements)
    parts = []
    for name, d in details.items():
        nonfinite = sum(v["count"] for v in d["nonfinite"].values())
        lists = d["malformed_top_lists"]
        part = (
            f"{name}: {nonfinite} non-finite logprob(s), "
            f"{lists['count']} of {lists['positions']} top lists malformed"
        )
        if "prefill_decode" in d:
            pd = d["prefill_decode"]
            part += (
                f", decode off prefill in {pd['disagreeing']} of {pd['sequences']} greedy sequences"
            )
        parts.append(part)
    return CheckResult(
        ID, TITLE, status, "; ".join(parts), _diagnosis(details, status), measurements, details
    )


def _diagnosis(details: dict[str, dict], status: Status) -> str:
    if status == Status.PASS:
        return ""
    out = []
    for name, d in details.items():
        if d["nonfinite"]:
            where = "; ".join(
                f"{kind} {v['count']} of {v['total']} (at {', '.join(v['positions'])})"
                for kind, v in d["nonfinite"].items()
            )
            out.append(
                f"The {name} engine returned non-finite (NaN/inf) logprobs: {where}. An RL loss over a batch "
                "holding one is NaN, and the comparisons with the reference are not judged for this engine. "
                "A known cause: processed logprobs under top-p/top-k from a non-contiguous (sliced) fp32 head "
                "(prime-rl #2497, fixed in vLLM #42739); check the head's dtype and the sampler's kernels."
            )
        lists = d["malformed_top_lists"]
        if lists["count"]:
            kinds = ", ".join(f"{KINDS[k]} at {v}" for k, v in lists["kinds"].items())
            out.append(
                f"The {name} engine's top-logprobs lists are malformed at {lists['count']} of "
                f"{lists['positions']} positions ({kinds}; e.g. {', '.join(lists['examples'][:3])}). "
                "A trainer or client that reads the sampled token's logprob from the list by position "
                "(the first entry) gets another token's number (NeMo-RL #3297, vLLM #36746): look the "
                "sampled token up by its id, and report the list's shape to the release."
            )
        pd = d.get("prefill_decode")
        if pd and pd["disagreeing"]:
            out.append(
                f"The {name} engine disagrees with itself: in {pd['disagreeing']} of {pd['sequences']} greedy "
                f"sequences (e.g. {', '.join(pd['examples'][:3])}) the logprobs it returned while decoding are "
                f"off the ones its own prefill gives for the same tokens by more than a factor "
                f"{SEQUENCE_ERROR_BAR} on average (largest |Δ| {pd['max_abs_diff']:.3g}). A trainer that scores "
                "rollouts by prefill then corrects for a mismatch the sampler never had, and the importance "
                "ratios of those sequences are wrong from the first step (NeMo-RL #2100 / #4243). Suspect "
                "the decode path: the attention backend, the KV-cache dtype, CUDA graphs or a compiled "
                "sampler; compare with enforce_eager and another attention backend."
            )
    return " ".join(out)


SPEC = CheckSpec(id=ID, title=TITLE, run=run, thresholds=THRESHOLDS)
