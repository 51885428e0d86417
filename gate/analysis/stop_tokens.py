"""Finish reasons and the stop tokens each engine honours, for config-parity.

A release that stops honouring a stop token turns every rollout into a max-length one, and nothing
errors: the stop token is sampled, generation goes on past it, the request ends on its length cap.
Read from the evidence of the sampled and greedy passes, per engine:

- the **finish reasons** (stop / length / abort / other) of each pass: details only, since how many
  samples end on their length cap moves with sampling;
- the **stop tokens it honoured**: the last token of sequences that finished with ``stop``, kept
  where it ended at least 3 and a tenth of them and never appears inside a sequence of that engine
  (a release that does not return the stop token itself would otherwise make an ordinary last token
  look like one);
- **stop tokens passed over**: a token the reference engine stopped at that the new engine sampled
  inside a sequence, going on past it. No sound engine does that (``min_tokens`` suppresses stop
  tokens, it does not sample them), so it FAILs with the token and where it was passed over.

Compared with the old engine, or without one with the baseline's evidence (which keeps no finish
reasons: there a sequence shorter than its pass's length cap counts as stopped).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from gate.checks.base import Measurement
from gate.contract import evidence as ev
from gate.contract import keys
from gate.verdict import Status

KEY = "stop_tokens"  # measurement names: stop_tokens.<token id>
PASSES = (keys.SAMPLE, keys.GREEDY)
STOP = keys.FINISH_NAMES.index("stop")
SHOWN = 5  # positions named per passed-over token
# A stop token ends at least this many, and this share, of an engine's stopped sequences: an
# ordinary token that happens to end a few of them (and never to sit inside one) is not taken for one.
MIN_SEQUENCES, MIN_SHARE = 3, 0.1


@dataclass(frozen=True)
class Finding:
    measurement: Measurement
    problem: str  # empty when nothing is wrong


def finish_reasons(e: ev.Evidence) -> dict[str, dict[str, int]]:
    """Per pass: how many sequences ended for each reason."""
    out = {}
    for group in PASSES:
        finish = e.arrays.get(f"{group}_{keys.FINISH}")
        if finish is None:
            continue
        codes = np.clip(np.asarray(finish, dtype=np.int64), 0, len(keys.FINISH_NAMES) - 1)
        counts = np.bincount(codes, minlength=len(keys.FINISH_NAMES))
        out[group] = {name: int(n) for name, n in zip(keys.FINISH_NAMES, counts, strict=True) if n}
    return out


def _inside(offsets: np.ndarray, n_tokens: int) -> np.ndarray:
    """Positions that are not the last of their sequence."""
    inside = np.ones(n_tokens, dtype=bool)
    ends = offsets[1:][np.diff(offsets) > 0] - 1
    inside[ends] = False
    return inside


def _passes(e: ev.Evidence) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(pass, offsets, token ids) of the sampled and greedy passes the evidence holds."""
    for group in PASSES:
        offsets, ids = (
            e.arrays.get(f"{group}_{keys.OFFSETS}"),
            e.arrays.get(f"{group}_{keys.TOKEN_IDS}"),
        )
        if offsets is not None and ids is not None:
            yield group, offsets, ids


def honoured(e: ev.Evidence, caps: dict[str, int] | None = None) -> dict[int, int]:
    """Token id -> sequences it ended with ``stop``, for tokens never seen inside a sequence.

    Evidence without finish reasons (a baseline keeps none) counts a sequence shorter than its
    pass's length cap (``caps``) as stopped.
    """
    ended: dict[int, int] = {}
    seen_inside: set[int] = set()
    for group, offsets, ids in _passes(e):
        seen_inside.update(np.unique(ids[_inside(offsets, len(ids))]).tolist())
        lengths = np.diff(offsets)
        finish = e.arrays.get(f"{group}_{keys.FINISH}")
        if finish is not None:
            is_stop = np.asarray(finish) == STOP
        elif caps is not None and group in caps:
            is_stop = lengths < caps[group]
        else:
            continue
        nonempty = lengths > 0
        last = ids[offsets[1:][nonempty] - 1]
        stopped = last[is_stop[nonempty]]
        for tok, n in zip(*np.unique(stopped, return_counts=True), strict=True):
            ended[int(tok)] = ended.get(int(tok), 0) + int(n)
    least = max(MIN_SEQUENCES, MIN_SHARE * sum(ended.values()))
    return {tok: n for tok, n in ended.items() if tok not in seen_inside and n >= least}


def passed_over(e: ev.Evidence, stop_ids: list[int]) -> dict[int, list[str]]:
    """Stop token id -> where ``e`` sampled it inside a sequence ("<pass> sequence S token T"),
    the first position in each sequence only (an engine past its stop token may sample it again)."""
    found: dict[int, list[str]] = {}
    if not stop_ids:
        return found
    for group, offsets, ids in _passes(e):
        hits = np.flatnonzero(np.isin(ids, stop_ids) & _inside(offsets, len(ids)))
        seq = np.searchsorted(offsets, hits, side="right") - 1
        # The first hit of each (token, sequence) pair: hits are in order, so np.unique's first index.
        _, first = np.unique(np.stack([ids[hits], seq]), axis=1, return_index=True)
        hits, seq = hits[np.sort(first)], seq[np.sort(first)]
        for pos, s in zip(hits.tolist(), seq.tolist(), strict=True):
            where = found.setdefault(int(ids[pos]), [])
            where.append(f"{group} sequence {s} token {pos - int(offsets[s])}")
    return found


def reference(ctx) -> tuple[ev.Evidence | None, str, dict[str, int]]:
    """What the new engine's stops are compared with: the old engine; without one, the baseline's
    evidence when it comes from the same model (stop tokens are the model's and the engine's, not
    the prompts'), with the length caps it was recorded with."""
    if ctx.old is not None:
        return ctx.old, "old", {}
    base = ctx.baseline
    if base is None or base.manifest.get("model", {}).get("sha256") != ctx.run["model"].get(
        "sha256"
    ):
        return None, "", {}
    caps = {
        group: (base.manifest.get(section) or {}).get("max_tokens")
        for group, section in ((keys.SAMPLE, "sampling"), (keys.GREEDY, "greedy"))
    }
    return base.evidence, "baseline", {g: int(c) for g, c in caps.items() if isinstance(c, int)}


def findings(
    against: ev.Evidence | None,
    new: ev.Evidence,
    label: str = "old",
    caps: dict[str, int] | None = None,
) -> tuple[list[Finding], dict[str, Any]]:
    """config-parity's measurements on stop tokens ``against`` the old engine or the baseline's
    evidence (``label``), and its ``details.finish`` record."""
    engines = {n: e for n, e in ((label, against), ("new", new)) if e is not None}
    honour = {n: honoured(e, caps) for n, e in engines.items()}
    details: dict[str, Any] = {
        "reasons": {n: finish_reasons(e) for n, e in engines.items()},
        "stop_tokens": {
            n: {
                str(t): {"text": e.token_label(t), "sequences": c}
                for t, c in sorted(honour[n].items())
            }
            for n, e in engines.items()
        },
    }
    if against is None:
        return [], details
    out = []
    missed = passed_over(new, sorted(honour[label]))
    for tok, where in sorted(missed.items()):
        text = new.token_label(tok)
        note = (
            f"{label} stopped at token {tok} ({text!r}) in {honour[label][tok]} sequence(s); new sampled "
            f"it inside {len(where)} and went on"
        )
        problem = (
            f"the new engine no longer stops at token {tok} ({text!r}): it sampled it inside {len(where)} "
            f"sequence(s) ({', '.join(where[:SHOWN])}) and generated on to the length cap, where the {label} "
            "engine stopped. Every rollout that samples it becomes a max-length one. Check the model's "
            "eos_token_id / generation_config.json as the new release reads them (config-parity lists "
            "any setting that changed) and the release's stop handling"
        )
        out.append(
            Finding(Measurement(f"{KEY}.{tok}", float(len(where)), Status.FAIL, note=note), problem)
        )
    details["passed_over"] = {str(t): w[:SHOWN] for t, w in missed.items()}
    return out, details
