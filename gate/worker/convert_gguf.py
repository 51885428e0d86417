"""``python -m gate.worker.convert_gguf MODEL.gguf OUT``: a GGUF checkpoint as a Hugging Face folder.

Run by :mod:`gate.models` in an engine environment (torch, transformers), with gguf and
accelerate on ``PYTHONPATH``. transformers dequantizes the GGUF on load, but refuses to save a
model it loaded that way ("quantized with QuantizationMethod.GGUF and is not serializable"), so
the weights go into a fresh model built from the same config without its quantization entry:
every key must match. What GGUF metadata loses is put back from the model's own config and
recorded: the tokenizer's end-of-sequence and padding tokens (llama.cpp's SmolLM2 GGUF gives the
tokenizer ``<|im_start|>`` as EOS, where the model's config and generation config say id 2,
``<|im_end|>``) and its maximum length. Writes OUT/.convert.json with the versions and fixes.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def convert(gguf: Path, out: Path) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    folder, name = str(gguf.parent), gguf.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = loaded.state_dict()
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(
            f"the GGUF's weights do not fit the model: missing {missing}, unexpected {unexpected}"
        )
    fresh.generation_config = loaded.generation_config
    fixes = _fix_tokenizer(tokenizer, config)
    out.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(out)
    tokenizer.save_pretrained(out)
    about = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gguf": _version("gguf"),
        "accelerate": _version("accelerate"),
        "architecture": type(fresh).__name__,
        "parameters": sum(p.numel() for p in fresh.parameters()),
        "state_dict_keys": len(state),
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "tokenizer_fixes": fixes,
        "seconds": round(time.perf_counter() - start, 1),
    }
    (out / ".convert.json").write_text(json.dumps(about, indent=2, sort_keys=True))
    return about


def _fix_tokenizer(tokenizer, config) -> dict[str, list]:
    """Make the tokenizer's EOS and PAD the model's (config.json's ids), and its length the model's."""
    fixes: dict[str, list] = {}
    for role in ("eos", "pad"):
        wanted = getattr(config, f"{role}_token_id", None)
        if isinstance(wanted, list):
            wanted = wanted[0] if wanted else None
        if wanted is None or getattr(tokenizer, f"{role}_token_id") == wanted:
            continue
        token = tokenizer.convert_ids_to_tokens(int(wanted))
        fixes[f"{role}_token"] = [getattr(tokenizer, f"{role}_token"), token]
        setattr(tokenizer, f"{role}_token", token)
    length = getattr(config, "max_position_embeddings", None)
    if length and tokenizer.model_max_length != length:
        fixes["model_max_length"] = [min(tokenizer.model_max_length, 2**63 - 1), length]
        tokenizer.model_max_length = length
    return fixes


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m gate.worker.convert_gguf MODEL.gguf OUT", file=sys.stderr)
        return 2
    about = convert(Path(argv[0]), Path(argv[1]))
    print(json.dumps(about, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
