"""Engine weight digests (gate/worker/weight_digests.py): what the three readings and the trainer's
tensors say, hand-built, without an engine."""

from __future__ import annotations

import hashlib

import pytest
import torch

from gate.worker.weight_digests import (
    EMPTY_DIGEST,
    EngineDigests,
    param_name,
    summarise,
    tensor_digest,
    trainer_digests,
)

PREFIX = "dp0:pp0:pcp0:tp0:"


def test_the_digest_is_vllms_sha256_of_the_bytes():
    t = torch.tensor([1.0, 2.0], dtype=torch.float32)
    assert tensor_digest(t) == hashlib.sha256(t.numpy().tobytes()).hexdigest()
    assert tensor_digest(t.to(torch.bfloat16)) != tensor_digest(t)
    assert tensor_digest(torch.empty(0)) == EMPTY_DIGEST
    # a strided view is digested as its values, as vLLM's checker does (contiguous first)
    m = torch.arange(6.0).reshape(2, 3)
    assert tensor_digest(m.t()) == tensor_digest(m.t().contiguous())


def test_param_name_strips_the_rank_prefix():
    assert param_name(PREFIX + "model.norm.weight") == "model.norm.weight"
    assert param_name("tp0:lm_head.weight") == "lm_head.weight"


def _state(seed: float) -> dict[str, torch.Tensor]:
    return {"model.norm.weight": torch.full((4,), seed), "model.embed_tokens.weight": torch.full((3, 4), seed + 1),
            "model.layers.0.mlp.down_proj.weight": torch.full((4, 4), seed + 2)}  # fmt: skip


def _engine(state: dict[str, torch.Tensor], packed=("model.layers.0.mlp.down_proj.weight",),
            prefix: str = PREFIX) -> EngineDigests:  # fmt: skip
    return EngineDigests("vLLM compute_weight_checksums", {
        prefix + name: EMPTY_DIGEST if name in packed else tensor_digest(t) for name, t in state.items()
    })  # fmt: skip


@pytest.fixture
def trainer():
    dtypes = {torch.float32}
    return trainer_digests(_state(1.0), dtypes), trainer_digests(_state(5.0), dtypes)


def test_a_faithful_push_has_no_finding(trainer):
    old, new = trainer
    s = summarise(_engine(_state(1.0)), _engine(_state(5.0)), _engine(_state(5.0)), old, new)
    assert (s["tensors"], s["readable"], s["comparable"], s["ranks"]) == (3, 2, 2, 1)
    assert s["unreadable"] == {"count": 1, "names": ["model.layers.0.mlp.down_proj.weight"]}
    assert all(
        s[k]["count"] == 0
        for k in ("not_moved", "round_trip_mismatch", "unchanged", "second_push_changed")
    )


def test_a_tensor_left_behind_is_not_moved_and_not_the_trainers(trainer):
    old, new = trainer
    after = {**_state(5.0), "model.norm.weight": _state(1.0)["model.norm.weight"]}
    s = summarise(_engine(_state(1.0)), _engine(after), _engine(after), old, new)
    assert s["not_moved"] == {"count": 1, "names": ["model.norm.weight"]}
    assert s["round_trip_mismatch"] == s["not_moved"] == s["unchanged"]


def test_garbage_moved_is_a_round_trip_mismatch_not_a_tensor_left_behind(trainer):
    old, new = trainer
    after = {
        **_state(5.0),
        "model.embed_tokens.weight": torch.zeros(3, 4),
    }  # bytes moved, wrong ones
    s = summarise(_engine(_state(1.0)), _engine(after), _engine(after), old, new)
    assert s["not_moved"]["count"] == 0
    assert s["round_trip_mismatch"]["names"] == ["model.embed_tokens.weight"]


def test_a_second_push_that_changes_bytes_is_named(trainer):
    old, new = trainer
    again = {**_state(5.0), "model.embed_tokens.weight": torch.full((3, 4), 9.0)}
    s = summarise(_engine(_state(1.0)), _engine(_state(5.0)), _engine(again), old, new)
    assert s["second_push_changed"]["names"] == ["model.embed_tokens.weight"]
    assert s["not_moved"]["count"] == s["round_trip_mismatch"]["count"] == 0


def test_a_tensor_the_engine_transforms_at_load_is_not_compared(trainer):
    """Its bytes before the push are not the trainer's old tensor (a fused, quantized or shifted
    copy): a round-trip mismatch there would be the transform, not a lost transfer."""
    old, new = trainer
    shifted = lambda s: {**s, "model.norm.weight": s["model.norm.weight"] + 1}  # noqa: E731
    s = summarise(_engine(shifted(_state(1.0))), _engine(shifted(_state(5.0))),
                  _engine(shifted(_state(5.0))), old, new)  # fmt: skip
    assert s["comparable"] == 1 and s["round_trip_mismatch"]["count"] == 0


def test_sharded_engines_compare_nothing_with_the_trainer_but_still_track_their_bytes(trainer):
    old, new = trainer

    def two(s):
        return EngineDigests(
            "x", {**_engine(s).tensors, **_engine(s, prefix="dp0:pp0:pcp0:tp1:").tensors}
        )

    s = summarise(two(_state(1.0)), two(_state(1.0)), two(_state(1.0)), old, new)
    assert s["ranks"] == 2 and s["comparable"] == 0 and s["round_trip_mismatch"]["count"] == 0
    assert s["unchanged"]["count"] == s["readable"] == 4  # a frozen policy, on every rank


def test_an_unreadable_reading_gives_its_reason(trainer):
    old, new = trainer
    none = EngineDigests(None, reason="the server offers no /weight_checker")
    s = summarise(_engine(_state(1.0)), none, none, old, new)
    assert s == {"source": None, "reason": "the server offers no /weight_checker"}


def test_trainer_digests_cover_an_fp32_head_beside_a_bf16_trunk():
    t = torch.randn(4, 4)
    d = trainer_digests({"lm_head.weight": t}, {torch.bfloat16, torch.float32})["lm_head.weight"]
    assert d == {tensor_digest(t), tensor_digest(t.to(torch.bfloat16))}
    ids = torch.tensor([1, 2])
    assert trainer_digests({"ids": ids}, {torch.bfloat16})["ids"] == {tensor_digest(ids)}
