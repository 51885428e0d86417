"""Offline cuts of recorded evidence: the evidence a replay of fewer prompts, or of shorter
completions, would have given, judged again by the same checks (scripts/sensitivity_sweep.py's
study sizes). Research code: the gate itself never cuts evidence.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gate.baseline import Baseline  # noqa: E402
from gate.checks.context import Context  # noqa: E402
from gate.config import GateConfig  # noqa: E402
from gate.contract import evidence as ev  # noqa: E402
from gate.contract import keys  # noqa: E402
from gate.files import RUN_FILE  # noqa: E402
from gate.judge import run_checks  # noqa: E402
from gate.repeat import ENGINES  # noqa: E402


def subset_evidence(
    e: ev.Evidence, prompts: np.ndarray, max_tokens: int | None = None
) -> ev.Evidence:
    """The evidence a replay of only ``prompts`` (indices, in this order) with ``max_tokens`` would give.

    Exact, not an approximation: per-prompt sampling seeds make a prompt's samples independent of
    which other prompts ran, and every per-token value (engine and trainer logprobs, ranks, top-k)
    of a position depends only on the tokens before it, so the first T tokens of a completion are
    what ``max_tokens=T`` would have produced (a cut sequence finishes with "length"). Teacher-forced
    sequences are kept whole for the chosen prompts. Arrays of the RL passes (``ws_``, ``grpo_``) do
    not belong to prompts and are dropped, and so is the text round trip of a pass whose sequences
    were cut (the engine's text of a cut sequence was never produced).
    """
    prompts = np.asarray(prompts, dtype=np.int64)
    a = e.arrays
    new_index = np.full(e.n_prompts, -1, dtype=np.int64)
    new_index[prompts] = np.arange(len(prompts))
    arrays = _prompt_arrays(a, prompts)
    for group, limit in (
        (keys.SAMPLE, max_tokens),
        (keys.GREEDY, max_tokens),
        (keys.TF, None),
    ):
        if f"{group}_{keys.OFFSETS}" in a:
            arrays.update(_group_subset(a, group, new_index, limit))
    return ev.Evidence(path=e.path, arrays=arrays, engine=e.engine, texts={})


def _prompt_arrays(a: dict[str, np.ndarray], prompts: np.ndarray) -> dict[str, np.ndarray]:
    off = a[keys.PROMPT_OFFSETS]
    lengths = off[prompts + 1] - off[prompts]
    return {
        keys.PROMPT_OFFSETS: np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        keys.PROMPT_TOKEN_IDS: a[keys.PROMPT_TOKEN_IDS][ev.token_ranges(off[prompts], lengths)],
    }


def _group_subset(
    a: dict[str, np.ndarray], group: str, new_index: np.ndarray, limit: int | None
) -> dict[str, np.ndarray]:
    """One pass's arrays for the kept prompts' sequences (in the new prompt order), cut to ``limit``."""
    g = f"{group}_"
    off = a[g + keys.OFFSETS]
    prompt_of = new_index[a[g + keys.PROMPT_INDEX]]
    seqs = np.flatnonzero(prompt_of >= 0)
    seqs = seqs[np.argsort(prompt_of[seqs], kind="stable")]  # sequences follow the new prompt order
    lengths = off[seqs + 1] - off[seqs]
    kept = lengths if limit is None else np.minimum(lengths, limit)
    tokens = ev.token_ranges(off[seqs], kept)
    text_trip = (g + keys.TEXT_MISMATCH, g + keys.RETOKENIZED_AT)  # per sequence
    out = {g + keys.OFFSETS: np.concatenate([[0], np.cumsum(kept)]).astype(np.int64),
           g + keys.PROMPT_INDEX: prompt_of[seqs].astype(a[g + keys.PROMPT_INDEX].dtype)}  # fmt: skip
    inputs = a.get(g + keys.INPUT_OFFSETS)
    for k in keys.keys_of(group):  # each array cut along its declared axis
        if k.name not in a or k.name in out:
            continue
        arr = a[k.name]
        if k.axis is keys.Axis.SEQUENCE:
            out[k.name] = arr[seqs]
        elif k.axis is keys.Axis.TOKEN:
            out[k.name] = arr[tokens]
        elif k.axis is keys.Axis.INPUT_OFFSETS:
            out[k.name] = np.concatenate([[0], np.cumsum(arr[seqs + 1] - arr[seqs])]).astype(
                arr.dtype
            )
        elif k.axis is keys.Axis.INPUT_TOKEN and inputs is not None:
            out[k.name] = arr[ev.token_ranges(inputs[seqs], inputs[seqs + 1] - inputs[seqs])]
    if np.any(kept < lengths):
        # the engine's text of a cut sequence was never produced: its round trip is not known
        for key in text_trip:
            out.pop(key, None)
    finish = g + keys.FINISH
    if finish in out:
        out[finish] = np.where(
            kept < lengths, keys.FINISH_NAMES.index("length"), out[finish]
        ).astype(out[finish].dtype)
    return out


def rejudge_subset(
    run_dir: Path,
    cfg: GateConfig,
    prompts: np.ndarray,
    max_tokens: int | None = None,
    baseline: Baseline | None = None,
) -> dict[str, str]:
    """Check statuses for ``run_dir``'s old/new evidence cut to ``prompts`` and ``max_tokens``.

    The same checks and settings ``gate check`` runs (gate.checks.run_checks); the baseline, when
    given, only contributes its noise floors and engine settings, since a subset is never
    token-comparable with it. Returns check id -> status.
    """
    run = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    old, new = (
        subset_evidence(
            ev.load(run_dir / "engines" / n, allow_nonfinite_engine=True), prompts, max_tokens
        )
        for n in ENGINES
    )
    run = run | {"sampling": run["sampling"] | ({"max_tokens": max_tokens} if max_tokens else {})}
    ctx = Context(
        new=new,
        old=old,
        run=run,
        baseline=baseline,
        baseline_comparable=False,
        noise_applicable=baseline is not None,
        acknowledge=frozenset(cfg.acknowledge),
        trainer_normalize=cfg.reference.normalize,
    )
    return {c.id: c.status.value for c in run_checks(ctx, cfg.check_settings)}
