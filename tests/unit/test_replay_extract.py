"""Parsing the engine's logprob containers into arrays, for both layouts vLLM has used.

The containers are built here with the same fields vLLM's ``FlatLogprobs`` and ``Logprob`` carry;
the real ones are exercised by the engine tests.
"""

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")

from gate.worker.replay import _prompt_logprobs_of, _sample_logprobs_of


def _flat(rows):
    """rows: per position, [(token, logprob, rank), ...] with the sampled token first."""
    flat = SimpleNamespace(start_indices=[], end_indices=[], token_ids=[], logprobs=[], ranks=[])
    for row in rows:
        flat.start_indices.append(len(flat.logprobs))
        for tok, lp, rank in row:
            flat.token_ids.append(tok), flat.logprobs.append(lp), flat.ranks.append(rank)
        flat.end_indices.append(len(flat.logprobs))
    return flat


def test_flat_layout_vectorised():
    rows = [
        [(7, -0.5, 1), (7, -0.5, 1), (3, -1.5, 2)],
        [(9, -3.0, 4), (2, -0.2, 1), (7, -2.0, 2)],
    ]
    lp, rank, ids, top = _sample_logprobs_of(_flat(rows), np.array([7, 9]), k=2)
    assert lp.tolist() == [-0.5, -3.0]
    assert rank.tolist() == [1, 4]
    assert ids.tolist() == [[7, 3], [2, 7]]
    assert top.tolist() == [[-0.5, -1.5], [-0.2, -2.0]]


def test_flat_layout_rejects_misaligned_tokens():
    with pytest.raises(RuntimeError, match="not the sampled token"):
        _sample_logprobs_of(_flat([[(1, -0.1, 1), (1, -0.1, 1)]]), np.array([2]), k=1)


def test_dict_layout_dedups_sampled_token_in_top_k():
    lp = lambda v, r: SimpleNamespace(logprob=v, rank=r)  # noqa: E731
    positions = [{7: lp(-0.5, 1), 3: lp(-1.5, 2)}, {9: lp(-3.0, 4), 2: lp(-0.2, 1), 7: lp(-2.0, 2)}]
    out_lp, rank, ids, top = _sample_logprobs_of(positions, np.array([7, 9]), k=2)
    assert out_lp.tolist() == [-0.5, -3.0]
    assert rank.tolist() == [1, 4]
    assert ids.tolist() == [[7, 3], [2, 7]]
    assert top.tolist() == [[-0.5, -1.5], [-0.2, -2.0]]


def test_prompt_logprobs_both_layouts():
    flat = _flat([[], [(5, -1.0, 3)], [(6, -2.0, 1)]])
    assert _prompt_logprobs_of(flat, [1, 5, 6]).tolist() == [-1.0, -2.0]
    with pytest.raises(RuntimeError, match="do not follow"):
        _prompt_logprobs_of(flat, [1, 5, 8])
    lp = lambda v: SimpleNamespace(logprob=v, rank=1)  # noqa: E731
    assert _prompt_logprobs_of([None, {5: lp(-1.0)}, {6: lp(-2.0)}], [1, 5, 6]).tolist() == [
        -1.0,
        -2.0,
    ]
