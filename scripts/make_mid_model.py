#!/usr/bin/env python3
"""Make a mid-size Llama (about 60 M parameters) for memory and timing checks, deterministically.

The built-in tiny model (0.6 M parameters, 2.4 MB) is too small for memory to mean anything: the
runtime's own footprint hides it. This model is big enough that weights, optimizer state and model
copies dominate what the worker holds, yet small enough for a 2-core CPU: 8 layers, hidden 768,
12 query heads and 4 key/value heads of 64, intermediate 2560, float32 (about 240 MB of weights).

It reuses the tiny model's character-level tokenizer (vocabulary 128), so every prompt set of the
CPU default works unchanged. The weights are random (seeded normal, std 0.02; norms 1): the model
has learnt nothing, which is all a memory plan or a timing needs.

Numpy and safetensors only (no torch): the same seed gives byte-identical files on any machine.
Large weights are never committed: the default output is ``$GATE_CACHE_DIR/models/mid-llama``
(``~/.cache/gate`` when unset). An existing folder with the same config and seed is kept.

Usage::

    python scripts/make_mid_model.py [--out DIR] [--seed N] [--layers N] [--hidden N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "gate" / "assets" / "models" / "tiny-arith"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
WEIGHTS_FILE = "model.safetensors"
INIT_STD = 0.02


def default_out() -> Path:
    cache = os.environ.get("GATE_CACHE_DIR") or Path.home() / ".cache" / "gate"
    return Path(cache) / "models" / "mid-llama"


def model_config(layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int) -> dict:
    """The tiny model's config.json with the mid-size shape (same tokenizer, same special ids)."""
    config = json.loads((TINY / "config.json").read_text())
    config.update(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        tie_word_embeddings=False,
        dtype="float32",
        torch_dtype="float32",
    )
    return config


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every weight of a LlamaForCausalLM with this config, by its transformers name."""
    v, h, i = config["vocab_size"], config["hidden_size"], config["intermediate_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}"
        shapes |= {
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (q, h),
            f"{p}.self_attn.k_proj.weight": (kv, h),
            f"{p}.self_attn.v_proj.weight": (kv, h),
            f"{p}.self_attn.o_proj.weight": (h, q),
            f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.mlp.gate_proj.weight": (i, h),
            f"{p}.mlp.up_proj.weight": (i, h),
            f"{p}.mlp.down_proj.weight": (h, i),
        }
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (v, h)
    return shapes


def weights(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """Seeded weights in name order: norms are ones, every matrix normal(0, INIT_STD)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            out[name] = np.ones(shape, dtype=np.float32)
        else:
            out[name] = (rng.standard_normal(shape, dtype=np.float32) * INIT_STD).astype(np.float32)
    return out


def make(out: Path, seed: int, config: dict) -> int:
    """Write the model folder; returns its parameter count. Kept as is when already made alike."""
    stamp = {"config": config, "seed": seed, "generator": "scripts/make_mid_model.py"}
    stamp_file = out / "GENERATED.json"
    shapes = tensor_shapes(config)
    params = sum(int(np.prod(s)) for s in shapes.values())
    if stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp:
        return params
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights(shapes, seed), str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(TINY / name, out / name)
    stamp_file.write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")  # last: marks done
    return params


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=None, help="default: $GATE_CACHE_DIR/models/mid-llama"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--intermediate", type=int, default=2560)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=4)
    args = parser.parse_args(argv)
    out = args.out or default_out()
    config = model_config(args.layers, args.hidden, args.intermediate, args.heads, args.kv_heads)
    params = make(out, args.seed, config)
    print(f"{out}: {params / 1e6:.1f}M parameters", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
