#!/usr/bin/env python3
"""Make the built-in CPU default's tiny model, deterministically, from scratch.

Writes ``gate/assets/models/tiny-arith/`` (or ``--out``): a 2-layer
Llama-architecture causal LM (~0.6 M parameters, float32) with a
character-level tokenizer, trained for a few minutes on one CPU thread.

What it learns
    * Two-digit addition in the worked format of ``arith.jsonl``
      (``"27+45="`` -> ``"7+5=12;2+4+1=7;#72"``, then ``</s>``).
    * Short templated English in chat form, the distribution of
      ``general.jsonl``.
    Every item of the two held-out prompt sets (read from ``--prompts``,
    written by ``scripts/make_prompt_sets.py``) is excluded from training,
    and training is deliberately short, so the model is peaked but only
    partly right on them; the script prints the held-out accuracy.

Tokenizer
    One token per character: ``"\\n"`` and printable ASCII, plus ``<pad>``
    (0), ``<s>`` (1, bos), ``</s>`` (2, eos), ``<unk>`` (3), the chat markers
    ``<|system|>``, ``<|user|>``, ``<|assistant|>`` and reserved tokens that
    fill the vocabulary to exactly 128, so every id the model can sample
    decodes to something.
    ``<s>`` handling: encoding plain text with special tokens (the default)
    prepends ``<s>`` through a post-processor; the chat template starts with
    ``{{ bos_token }}`` and must be tokenized with ``add_special_tokens=False``
    (as ``apply_chat_template`` and vLLM's chat path do).  Either way a
    sequence starts with exactly one ``<s>``.  Chat renders as
    ``<s><|user|>QUESTION\\n<|assistant|>REPLY</s>``.

Determinism
    Fixed seeds, ``torch.use_deterministic_algorithms(True)`` and one CPU
    thread: re-running on the same machine and software gives byte-identical
    ``model.safetensors`` (other CPUs or library versions may differ in the
    last bits; SHA256SUMS records what was committed).

The files written are also readable by transformers 4.x (legacy config keys
and ``PreTrainedTokenizerFast`` as tokenizer class), so older vLLM releases
can load the same folder.

Usage::

    python scripts/make_tiny_model.py [--out gate/assets/models/tiny-arith] [--steps N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import re
import sys
import time
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_prompt_sets as ps

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "gate" / "assets" / "models" / "tiny-arith"
DEFAULT_PROMPTS = REPO / "gate" / "assets" / "prompts"
GENERATOR = "python scripts/make_tiny_model.py"

VOCAB_SIZE = 128
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
CHAT_MARKERS = ["<|system|>", "<|user|>", "<|assistant|>"]
MAX_POSITIONS = 256

# Jinja chat template.  '\n' is a Jinja string escape (a real newline in the
# output); using expressions rather than literal text keeps whitespace exact.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<|system|>' + message['content'] + '\\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>' + message['content'] + '\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>' + message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('unsupported role: ' + message['role']) }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

# Training hyper-parameters.  Arithmetic is learnt abruptly (0 % held-out
# accuracy at ~100 steps, ~100 % by ~300 with an arithmetic-heavy mix), while
# memorising the chat text is slow; so batches are mostly chat and
# DEFAULT_STEPS stops inside the arithmetic transition: ~50 % greedy held-out
# accuracy, in the 20-70 % band that leaves a short RL run room to improve.
# Training takes about 105 s on one thread of a 2-core AMD EPYC.
DEFAULT_STEPS = 350
DEFAULT_SEED = 0
BATCH_SIZE = 64
CHAT_PER_BATCH = 52  # the rest of each batch is arithmetic
LEARNING_RATE = 3e-3
WARMUP_STEPS = 50
WEIGHT_DECAY = 0.01
EVAL_TEMPERATURE = 0.7
# The shape of a worked answer, right or wrong.
ARITH_FORMAT = re.compile(r"\d\+\d=\d+;\d\+\d(\+1)?=\d+;#\d+")


# --------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------


def build_vocab() -> tuple[list[str], list[str]]:
    """Return (all tokens in id order, the special ones)."""
    specials = [PAD, BOS, EOS, UNK, *CHAT_MARKERS]
    chars = ["\n"] + [chr(c) for c in range(32, 127)]  # printable ASCII incl. space
    reserved = [f"<|reserved_{i}|>" for i in range(VOCAB_SIZE - len(specials) - len(chars))]
    tokens = specials + chars + reserved
    assert len(tokens) == VOCAB_SIZE and len(set(tokens)) == VOCAB_SIZE
    return tokens, specials + reserved


def build_tokenizer() -> PreTrainedTokenizerFast:
    tokens, special = build_vocab()
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Isolate every character ([\s\S] also matches "\n", unlike ".").
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Fuse joins the pieces with no separator (WordLevel would insert spaces).
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    # Registered as special so they match as whole tokens inside text (the
    # chat template renders them as strings) and are skipped when decoding.
    tok.add_special_tokens(special)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=CHAT_MARKERS,
        model_max_length=MAX_POSITIONS,
        padding_side="left",  # batched generation needs left padding
        clean_up_tokenization_spaces=False,  # would eat spaces before punctuation
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


# --------------------------------------------------------------------------
# Training data
# --------------------------------------------------------------------------


def read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def chat_text(tokenizer, user: str, reply: str | None = None) -> str:
    """Render one exchange with the chat template (a prompt if reply is None)."""
    messages = [{"role": "user", "content": user}]
    if reply is not None:
        messages.append({"role": "assistant", "content": reply})
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=reply is None
    )


def training_sequences(tokenizer, held_arith: list[dict], held_general: list[dict]):
    """Token-id lists for every non-held-out example, arith and chat separately."""
    held_prompts = {rec["prompt"] for rec in held_arith}
    held_users = {rec["messages"][0]["content"] for rec in held_general}
    arith = []
    for a, b in ps.arith_universe():
        prompt = ps.arith_prompt(a, b)
        if prompt not in held_prompts:
            arith.append(tokenizer.encode(prompt + ps.arith_reference(a, b) + EOS))
    chat = []
    for _, user, reply in ps.general_universe():
        if user not in held_users:
            # The template already holds <s> and </s>; add nothing more.
            chat.append(
                tokenizer.encode(chat_text(tokenizer, user, reply), add_special_tokens=False)
            )
    assert len(arith) == len(ps.arith_universe()) - len(held_arith)
    assert len(chat) == len(ps.general_universe()) - len(held_general)
    return arith, chat


def make_batch(rng: random.Random, arith: list, chat: list, pad_id: int):
    """A right-padded batch with a fixed arith/chat mix; pads are ignored by the loss.

    A fixed mix per batch (rather than all-arith and all-chat batches) keeps
    the gradient of every step balanced; alternating kinds made Adam
    oscillate and learn arithmetic several times slower.  No attention mask
    is needed: with right padding and a causal model the pads only follow
    the real tokens, so they never influence them.
    """
    seqs = [rng.choice(chat) for _ in range(CHAT_PER_BATCH)]
    seqs += [rng.choice(arith) for _ in range(BATCH_SIZE - CHAT_PER_BATCH)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq)
        labels[row, : len(seq)] = torch.tensor(seq)
    return ids, labels


# --------------------------------------------------------------------------
# Model and training
# --------------------------------------------------------------------------


def build_model(tokenizer) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,  # vLLM's CPU attention refuses smaller heads (e.g. 16)
        intermediate_size=512,
        num_hidden_layers=2,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.config.use_cache = True
    return model


def lr_at(step: int, steps: int) -> float:
    """Linear warm-up, then cosine decay to 10 % of the peak."""
    if step < WARMUP_STEPS:
        return LEARNING_RATE * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
    return LEARNING_RATE * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def train(model, arith, chat, pad_id: int, steps: int, seed: int) -> float:
    """Train in place; return wall seconds."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps)
        ids, labels = make_batch(rng, arith, chat, pad_id)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            print(
                f"step {step:5d}  loss {loss.item():.4f}  lr {lr_at(step, steps):.2e}  "
                f"{time.perf_counter() - start:6.1f}s",
                flush=True,
            )
    model.eval()
    return time.perf_counter() - start


# --------------------------------------------------------------------------
# Held-out evaluation (plain torch loop: fast, and free of generate() defaults)
# --------------------------------------------------------------------------


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list[list[int]],
    max_new: int,
    temperature: float,
    gen: torch.Generator | None,
) -> list[str]:
    """Decode each prompt greedily (temperature 0) or by sampling; stop at </s>."""
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = (ids != pad).long()
    eos = tokenizer.eos_token_id
    done = torch.zeros(len(prompts), dtype=torch.bool)
    out = []
    for _ in range(max_new):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = (
            model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].float()
        )
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            nxt = torch.multinomial(
                torch.softmax(logits / temperature, -1), 1, generator=gen
            ).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
        out.append(nxt)
        done |= nxt == eos
        # Finished rows keep running on pads; their outputs are cut at </s>.
        ids = torch.cat([ids, nxt[:, None]], 1)
        mask = torch.cat([mask, torch.ones_like(nxt)[:, None]], 1)
        if done.all():
            break
    texts = []
    for row in torch.stack(out, 1).tolist():
        row = row[: row.index(eos)] if eos in row else row
        texts.append(tokenizer.decode(row, skip_special_tokens=True))
    return texts


def evaluate(model, tokenizer, held_arith: list[dict], held_general: list[dict], seed: int) -> dict:
    prompts = [tokenizer.encode(r["prompt"]) for r in held_arith]
    gen = torch.Generator().manual_seed(seed)
    greedy = generate(model, tokenizer, prompts, 32, 0.0, None)
    sampled = generate(model, tokenizer, prompts, 32, EVAL_TEMPERATURE, gen)
    answers = [r["answer"] for r in held_arith]

    def accuracy(texts):
        return sum(ps.arith_answer(t) == a for t, a in zip(texts, answers, strict=True)) / len(
            answers
        )

    chat_prompts = [
        tokenizer.encode(
            chat_text(tokenizer, r["messages"][0]["content"]), add_special_tokens=False
        )
        for r in held_general
    ]
    replies = generate(model, tokenizer, chat_prompts, 48, 0.0, None)
    for rec, text in list(zip(held_arith, greedy, strict=True))[:4]:
        print(f"  {rec['prompt']!r} -> {text!r}  (ref {rec['reference']!r})")
    for rec, text in list(zip(held_general, replies, strict=True))[:4]:
        print(f"  {rec['messages'][0]['content']!r} -> {text!r}  (ref {rec['reference']!r})")
    return {
        "arith_greedy_accuracy": accuracy(greedy),
        f"arith_t{EVAL_TEMPERATURE}_accuracy": accuracy(sampled),
        "arith_greedy_format_ok": sum(bool(ARITH_FORMAT.fullmatch(t)) for t in greedy)
        / len(greedy),
        "general_greedy_exact": sum(
            t == r["reference"] for t, r in zip(replies, held_general, strict=True)
        )
        / len(replies),
    }


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------


def save_tokenizer(tokenizer, out: Path) -> None:
    # save_jinja_files=False keeps chat_template inside tokenizer_config.json.
    tokenizer.save_pretrained(out, save_jinja_files=False)
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    # transformers 5 names its own backend class; 4.x only knows this name.
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    # 5.x writes the chat markers as a list under "extra_special_tokens",
    # which 4.x expects to be a dict (it calls .items()); the legacy key is
    # read by both.
    if isinstance(cfg.get("extra_special_tokens"), list):
        cfg["additional_special_tokens"] = cfg.pop("extra_special_tokens")
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def save_model(model, out: Path) -> None:
    model.save_pretrained(out)  # transformers 5 always writes safetensors
    if not (out / "model.safetensors").is_file():
        raise RuntimeError("save_pretrained did not write model.safetensors")
    path = out / "config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    # Legacy spellings so transformers 4.x (older vLLM) reads the same values.
    cfg.setdefault("torch_dtype", "float32")
    cfg.setdefault("rope_theta", cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    # Only the special ids: vLLM takes sampling defaults from this file, so
    # it must not carry temperature/top_p/top_k or a transformers version.
    gen_cfg = {
        "bos_token_id": model.config.bos_token_id,
        "eos_token_id": model.config.eos_token_id,
        "pad_token_id": model.config.pad_token_id,
    }
    (out / "generation_config.json").write_text(
        json.dumps(gen_cfg, indent=2) + "\n", encoding="utf-8"
    )


def write_readme(out: Path, metrics: dict, steps: int, seed: int) -> None:
    lines = [
        "# tiny-arith",
        "",
        "A tiny from-scratch Llama-architecture causal LM (2 layers, hidden 128, 2 heads of 64,",
        f"vocab {VOCAB_SIZE}, float32, ~0.6 M parameters) with a character-level tokenizer.",
        "It is the built-in CPU default model of the gate: small enough to run in CI on a CPU,",
        "trained enough to produce peaked, partly-right outputs.",
        "",
        "- Trained on two-digit addition in a worked format (`27+45=` -> `7+5=12;2+4+1=7;#72</s>`)",
        "  and short templated English chat (`<s><|user|>What color is snow?\\n<|assistant|>Snow is white.</s>`).",
        "- The prompt sets in `gate/assets/prompts/` are held out of its training data.",
        "- Plain-text encoding prepends `<s>`; the chat template emits `<s>` itself",
        "  (tokenize its output with `add_special_tokens=False`).",
        f"- Held-out results at creation: arith greedy accuracy {metrics['arith_greedy_accuracy']:.0%},",
        f"  arith accuracy at T={EVAL_TEMPERATURE} {metrics[f'arith_t{EVAL_TEMPERATURE}_accuracy']:.0%},",
        f"  general greedy exact match {metrics['general_greedy_exact']:.0%}.",
        "",
        f"Made by `{GENERATOR} --steps {steps} --seed {seed}` (deterministic: same machine and",
        "software give byte-identical files; `SHA256SUMS` lists the committed ones).",
        "",
        "License: made by this project from scratch (no third-party weights or data); Apache-2.0,",
        "like the rest of the project.",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")


def write_sha256sums(out: Path) -> None:
    lines = []
    for path in sorted(p for p in out.iterdir() if p.is_file() and p.name != "SHA256SUMS"):
        lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n")
    (out / "SHA256SUMS").write_text("".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)"
    )
    parser.add_argument(
        "--prompts",
        type=Path,
        default=DEFAULT_PROMPTS,
        help="folder with the held-out arith.jsonl and general.jsonl (default: %(default)s)",
    )
    parser.add_argument(
        "--steps", type=int, default=DEFAULT_STEPS, help="training steps (default: %(default)s)"
    )
    parser.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help="seed (default: %(default)s)"
    )
    args = parser.parse_args(argv)

    # One thread and deterministic kernels: the only way to get the same
    # bytes on every run (multi-threaded reductions may reorder sums).
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)

    held_arith = read_jsonl(args.prompts / "arith.jsonl")
    held_general = read_jsonl(args.prompts / "general.jsonl")
    tokenizer = build_tokenizer()
    arith, chat = training_sequences(tokenizer, held_arith, held_general)
    print(
        f"training examples: {len(arith)} arith, {len(chat)} chat "
        f"(held out: {len(held_arith)} arith, {len(held_general)} chat)"
    )

    model = build_model(tokenizer)
    print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
    seconds = train(model, arith, chat, tokenizer.pad_token_id, args.steps, args.seed)
    print(f"training time: {seconds:.1f}s for {args.steps} steps")

    metrics = evaluate(model, tokenizer, held_arith, held_general, args.seed)
    for key, value in metrics.items():
        print(f"{key}: {value:.3f}")

    args.out.mkdir(parents=True, exist_ok=True)
    for stale in args.out.iterdir():  # a clean folder, so SHA256SUMS lists only our files
        if stale.is_file():
            stale.unlink()
    save_model(model, args.out)
    save_tokenizer(tokenizer, args.out)
    write_readme(args.out, metrics, args.steps, args.seed)
    write_sha256sums(args.out)
    size = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"wrote {args.out} ({size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
