#!/usr/bin/env python3
"""Write the built-in CPU default's prompt sets, deterministically.

Two sets go to ``gate/assets/prompts/`` (or ``--out``), each as a JSONL file
plus a ``<name>.manifest.json`` that records its sha256:

``arith.jsonl`` (64 records)
    Two-digit addition with a short worked answer, written the way the tiny
    character-level model in ``gate/assets/models/tiny-arith`` was trained
    to answer it: units column, then tens column (with ``+1`` when the units
    carried), then ``#`` and the final sum::

        {"id": "arith-000", "prompt": "27+45=", "reference": "7+5=12;2+4+1=7;#72", "answer": "72"}

    The prompt is plain text (no chat template).  ``reference`` is the exact
    expected completion (at most 20 characters, before the end-of-sequence
    token).  ``answer`` is the final number alone; a reward function takes
    the text after the last ``#`` of a completion, strips it, and compares
    it to ``answer`` for an exact match.

``general.jsonl`` (16 records)
    Short templated English in chat form (colours, capitals, opposites,
    greetings, ...), the same distribution the tiny model saw as chat text::

        {"id": "general-00",
         "messages": [{"role": "user", "content": "What color is snow?"}],
         "reference": "Snow is white."}

    ``reference`` is a plausible assistant reply of at most 40 characters.

Both sets are held out: ``scripts/make_tiny_model.py`` reads these files and
drops every matching item from its training data, so the gate measures a
model that is only partly right (and that a short RL run can still improve).

Only the standard library is used: a seeded ``random.Random`` (whose
``sample``/``shuffle`` output CPython keeps stable across versions), so the
files are byte-identical on every machine.

Usage::

    python scripts/make_prompt_sets.py [--out gate/assets/prompts] [--seed 1234]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "gate" / "assets" / "prompts"
DEFAULT_SEED = 1234
GENERATOR = "python scripts/make_prompt_sets.py"

ARITH_RECORDS = 64
GENERAL_RECORDS = 16
ARITH_MIN, ARITH_MAX = 10, 99  # both operands always have two digits
ANSWER_MARKER = "#"
MAX_ARITH_REFERENCE = 24
MAX_GENERAL_REFERENCE = 40
# At most this many held-out general items share one template, so the small
# set still covers most kinds of question.
GENERAL_PER_TEMPLATE = 2


# --------------------------------------------------------------------------
# Arithmetic: the format shared with the model's training data.
# --------------------------------------------------------------------------


def arith_prompt(a: int, b: int) -> str:
    """The plain-text prompt for ``a + b``."""
    return f"{a}+{b}="


def arith_reference(a: int, b: int) -> str:
    """The worked completion for ``a + b``: units, tens (+ carry), marker, sum.

    Writing the columns out gives a character-level model intermediate steps
    it can learn locally, and gives the gate ~20 generated tokens per prompt
    to compare instead of 2 or 3.
    """
    ua, ub = a % 10, b % 10
    ta, tb = a // 10, b // 10
    units = ua + ub
    carry = units // 10
    tens = ta + tb + carry
    tens_expr = f"{ta}+{tb}" + ("+1" if carry else "")
    return f"{ua}+{ub}={units};{tens_expr}={tens};{ANSWER_MARKER}{a + b}"


def arith_answer(completion: str) -> str:
    """The final answer in a completion: the text after the last marker."""
    return completion.rpartition(ANSWER_MARKER)[2].strip()


def arith_universe() -> list[tuple[int, int]]:
    """Every operand pair the format covers (8,100 pairs)."""
    span = range(ARITH_MIN, ARITH_MAX + 1)
    return [(a, b) for a in span for b in span]


# --------------------------------------------------------------------------
# General chat text: small templated English with fixed facts.
# --------------------------------------------------------------------------

_COLORS = {
    "the sky": "blue",
    "grass": "green",
    "snow": "white",
    "coal": "black",
    "a banana": "yellow",
    "a tomato": "red",
    "a lemon": "yellow",
    "milk": "white",
    "a carrot": "orange",
    "a frog": "green",
    "the sun": "yellow",
    "a crow": "black",
    "an apple": "red",
    "the sea": "blue",
    "chalk": "white",
    "a pumpkin": "orange",
    "a leaf": "green",
    "soot": "black",
}
_LEGS = {
    "cat": 4,
    "dog": 4,
    "bird": 2,
    "spider": 8,
    "ant": 6,
    "snake": 0,
    "horse": 4,
    "cow": 4,
    "duck": 2,
    "bee": 6,
    "fish": 0,
    "crab": 10,
    "goat": 4,
    "hen": 2,
    "fly": 6,
    "pig": 4,
}
_NAMES = [
    "Ada",
    "Ben",
    "Cleo",
    "Dan",
    "Eva",
    "Finn",
    "Gus",
    "Hana",
    "Ivan",
    "Jo",
    "Kim",
    "Leo",
    "Mia",
    "Ned",
    "Olga",
    "Paul",
    "Rosa",
    "Sam",
    "Tara",
    "Uma",
    "Vic",
    "Wes",
    "Yara",
    "Zoe",
]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
_OPPOSITES = [
    ("hot", "cold"),
    ("big", "small"),
    ("up", "down"),
    ("fast", "slow"),
    ("old", "new"),
    ("day", "night"),
    ("wet", "dry"),
    ("open", "closed"),
    ("light", "dark"),
    ("full", "empty"),
    ("hard", "soft"),
    ("early", "late"),
    ("happy", "sad"),
    ("near", "far"),
    ("rich", "poor"),
    ("loud", "quiet"),
]
_CAPITALS = {
    "France": "Paris",
    "Spain": "Madrid",
    "Italy": "Rome",
    "Japan": "Tokyo",
    "Egypt": "Cairo",
    "Peru": "Lima",
    "Kenya": "Nairobi",
    "Norway": "Oslo",
    "Greece": "Athens",
    "Canada": "Ottawa",
    "Cuba": "Havana",
    "Chile": "Santiago",
    "Poland": "Warsaw",
    "Ireland": "Dublin",
    "Germany": "Berlin",
    "Mexico": "Mexico City",
    "Portugal": "Lisbon",
    "Austria": "Vienna",
    "Sweden": "Stockholm",
    "India": "New Delhi",
}
_NOUNS = [
    "cat",
    "dog",
    "book",
    "tree",
    "car",
    "cup",
    "bird",
    "lamp",
    "door",
    "hat",
    "pen",
    "ship",
    "road",
    "star",
    "bell",
    "coin",
    "rock",
    "boat",
]


def _capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


def general_universe() -> list[tuple[str, str, str]]:
    """Every templated exchange as ``(template, user text, assistant reply)``.

    The order is fixed (dicts keep insertion order), so a seeded sample of it
    is reproducible.
    """
    items: list[tuple[str, str, str]] = []
    for thing, color in _COLORS.items():
        items.append(("color", f"What color is {thing}?", f"{_capitalize(thing)} is {color}."))
    for animal, legs in _LEGS.items():
        items.append(
            ("legs", f"How many legs does a {animal} have?", f"A {animal} has {legs} legs.")
        )
    for name in _NAMES:
        items.append(("hello", f"Say hello to {name}.", f"Hello, {name}!"))
    for seq, tag in ((_DAYS, "day"), (_MONTHS, "month")):
        for i, cur in enumerate(seq):
            nxt = seq[(i + 1) % len(seq)]
            items.append((tag, f"What {tag} comes after {cur}?", f"{nxt} comes after {cur}."))
    for left, right in _OPPOSITES:
        for word, opp in ((left, right), (right, left)):
            items.append(
                (
                    "opposite",
                    f"What is the opposite of {word}?",
                    f"The opposite of {word} is {opp}.",
                )
            )
    for country, city in _CAPITALS.items():
        items.append(
            (
                "capital",
                f"What is the capital of {country}?",
                f"The capital of {country} is {city}.",
            )
        )
    for noun in _NOUNS:
        items.append(
            ("plural", f"What is the plural of {noun}?", f"The plural of {noun} is {noun}s.")
        )
        items.append(("upper", f"Write {noun} in capitals.", noun.upper()))
    return items


# --------------------------------------------------------------------------
# Held-out selection and records.
# --------------------------------------------------------------------------


def select_arith(rng: random.Random, count: int) -> list[tuple[int, int]]:
    """A seeded sample of operand pairs, in sampling order."""
    return rng.sample(arith_universe(), count)


def select_general(rng: random.Random, count: int) -> list[tuple[str, str, str]]:
    """A seeded sample of exchanges, at most GENERAL_PER_TEMPLATE per template."""
    pool = general_universe()
    rng.shuffle(pool)
    chosen: list[tuple[str, str, str]] = []
    per_template: dict[str, int] = {}
    for item in pool:
        if per_template.get(item[0], 0) >= GENERAL_PER_TEMPLATE:
            continue
        per_template[item[0]] = per_template.get(item[0], 0) + 1
        chosen.append(item)
        if len(chosen) == count:
            return chosen
    raise ValueError(f"only {len(chosen)} general items available, wanted {count}")


def arith_records(pairs: list[tuple[int, int]]) -> list[dict]:
    records = []
    for i, (a, b) in enumerate(pairs):
        reference = arith_reference(a, b)
        assert len(reference) <= MAX_ARITH_REFERENCE, reference
        records.append(
            {
                "id": f"arith-{i:03d}",
                "prompt": arith_prompt(a, b),
                "reference": reference,
                "answer": str(a + b),
            }
        )
    return records


def general_records(items: list[tuple[str, str, str]]) -> list[dict]:
    records = []
    for i, (_, user, reply) in enumerate(items):
        assert len(reply) <= MAX_GENERAL_REFERENCE, reply
        records.append(
            {
                "id": f"general-{i:02d}",
                "messages": [{"role": "user", "content": user}],
                "reference": reply,
            }
        )
    return records


# --------------------------------------------------------------------------
# Output.
# --------------------------------------------------------------------------


def write_set(
    out: Path, name: str, records: list[dict], description: str, generator: str = GENERATOR
) -> Path:
    """Write ``<name>.jsonl`` and its manifest; return the JSONL path."""
    data = "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in records).encode("utf-8")
    jsonl = out / f"{name}.jsonl"
    jsonl.write_bytes(data)
    manifest = {
        "name": name,
        "file": jsonl.name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "records": len(records),
        "generator": generator,
        "description": description,
    }
    (out / f"{name}.manifest.json").write_text(
        json.dumps(manifest, indent=2, sort_keys=False) + "\n", encoding="utf-8"
    )
    return jsonl


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)"
    )
    parser.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help="sampling seed (default: %(default)s)"
    )
    args = parser.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    # One generator per set, so changing one set's size never reshuffles the other.
    arith = arith_records(select_arith(random.Random(args.seed), ARITH_RECORDS))
    general = general_records(select_general(random.Random(args.seed + 1), GENERAL_RECORDS))

    paths = [
        write_set(
            args.out,
            "arith",
            arith,
            "Two-digit addition, plain-text prompt 'A+B=', worked completion "
            "'units;tens;#SUM'; reward = exact match of the text after the last '#' "
            "with 'answer'. Held out from the tiny-arith model's training data.",
        ),
        write_set(
            args.out,
            "general",
            general,
            "Short templated English questions in chat form with a reference "
            "assistant reply. Held out from the tiny-arith model's training data.",
        ),
    ]
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
