#!/usr/bin/env python3
"""Write the chat-model prompt sets (examples/smollm2-cpu.yaml), deterministically.

Two sets go to ``gate/assets/prompts/`` (or ``--out``), each as a JSONL file plus a
``<name>.manifest.json`` that records its sha256:

``chat.jsonl`` (24 records)
    Conversations the way a chat policy meets them in RL rollouts: 12 single-turn questions and
    12 multi-turn conversations whose earlier assistant turns are in the prompt (the template
    renders them, ``<|im_end|>`` and all), some with a system prompt of their own. ``reference``
    is a short, plausible assistant reply, scored teacher-forced::

        {"id": "chat-12", "messages": [{"role": "user", "content": "My name is Ada. ..."},
                                       {"role": "assistant", "content": "..."},
                                       {"role": "user", "content": "What is my name?"}],
         "reference": "Your name is Ada."}

``sums.jsonl`` (32 records)
    The GRPO task: single-digit addition asked in chat form, with a verifiable ``answer``; the
    reward is 1 when the last integer of the reply equals it. Chosen because SmolLM2-135M-Instruct
    solves it only partly (a mean reward near 0.3 at T 0.7, docs/validation.md), so the mini GRPO
    run has something to learn: two-digit sums (0.14) and subtraction (0.06) give almost no
    signal, and a plain "What is a + b?" invites long answers whose last integer is not the sum.

Only the standard library is used, with a seeded ``random.Random``, so the files are
byte-identical on every machine.

Usage::

    python scripts/make_chat_prompt_sets.py [--out gate/assets/prompts] [--seed 2025]
"""

from __future__ import annotations

import argparse
import random
from functools import partial
from pathlib import Path

from make_prompt_sets import write_set as _write_set  # scripts/ is on sys.path when run

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "gate" / "assets" / "prompts"
DEFAULT_SEED = 2025
GENERATOR = "python scripts/make_chat_prompt_sets.py"
write_set = partial(_write_set, generator=GENERATOR)
SUMS_RECORDS = 32
SUMS_INSTRUCTION = "Reply with only the number."

_SINGLE = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Name a fruit that is yellow.", "A banana is yellow."),
    ("How many days are in a week?", "There are seven days in a week."),
    ("What is the opposite of hot?", "The opposite of hot is cold."),
    ("Write one sentence about the sea.", "The sea is deep, wide and full of life."),
    ("What do bees make?", "Bees make honey."),
    ("Translate 'thank you' into French.", "'Thank you' in French is 'merci'."),
    ("Which planet is closest to the Sun?", "Mercury is the closest planet to the Sun."),
    ("Give me a synonym for 'happy'.", "A synonym for 'happy' is 'joyful'."),
    ("What colour is the sky on a clear day?", "On a clear day the sky is blue."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("Finish the sentence: The early bird ...", "The early bird catches the worm."),
]

_NAMES = ["Ada", "Ben", "Cleo", "Dan", "Eva", "Finn"]
_CITIES = ["Paris", "Rome", "Madrid", "Berlin", "Vienna", "Lisbon"]
_PETS = ["cat", "dog", "parrot", "rabbit", "hamster", "goldfish"]
_SYSTEMS = [
    "You are a concise assistant. Answer in one sentence.",
    "You are a friendly tutor who explains things simply.",
]


def single_turn() -> list[dict]:
    return [
        {"id": f"chat-{i:02d}", "messages": [{"role": "user", "content": q}], "reference": a}
        for i, (q, a) in enumerate(_SINGLE)
    ]


def multi_turn(rng: random.Random, first_id: int) -> list[dict]:
    """Two- and three-turn conversations: the last question needs an earlier turn to answer."""
    records = []
    for i in range(12):
        name, city, pet = rng.choice(_NAMES), rng.choice(_CITIES), rng.choice(_PETS)
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        kind = i % 4
        if kind == 0:
            turns = [
                ("user", f"Hi, my name is {name}."),
                ("assistant", f"Nice to meet you, {name}! How can I help you today?"),
                ("user", "What is my name?"),
            ]
            reference = f"Your name is {name}."
        elif kind == 1:
            turns = [
                ("user", f"I live in {city}. Which country is that in?"),
                ("assistant", f"{city} is a capital city in Europe."),
                ("user", "Which city did I say I live in?"),
            ]
            reference = f"You said you live in {city}."
        elif kind == 2:
            turns = [
                ("user", f"What is {a} + {b}?"),
                ("assistant", f"{a} + {b} = {a + b}."),
                ("user", "And if you add one more?"),
            ]
            reference = f"{a + b} + 1 = {a + b + 1}."
        else:
            turns = [
                ("user", f"I have a {pet}."),
                ("assistant", f"A {pet} is a lovely pet. What is its name?"),
                ("user", f"Its name is {name}. What kind of pet do I have?"),
            ]
            reference = f"You have a {pet} named {name}."
        if i % 3 == 0:  # a system prompt of its own replaces the template's default one
            turns.insert(0, ("system", _SYSTEMS[(i // 3) % len(_SYSTEMS)]))
        records.append(
            {
                "id": f"chat-{first_id + i:02d}",
                "messages": [{"role": r, "content": c} for r, c in turns],
                "reference": reference,
            }
        )
    return records


def sums(rng: random.Random) -> list[dict]:
    pairs = rng.sample([(a, b) for a in range(2, 10) for b in range(2, 10)], SUMS_RECORDS)
    return [
        {
            "id": f"sums-{i:02d}",
            "messages": [{"role": "user", "content": f"What is {a} + {b}? {SUMS_INSTRUCTION}"}],
            "reference": str(a + b),
            "answer": str(a + b),
        }
        for i, (a, b) in enumerate(pairs)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    chat = single_turn()
    chat += multi_turn(rng, len(chat))
    write_set(args.out, "chat", chat,
              "Chat conversations for an instruct model: 12 single-turn, 12 multi-turn with earlier "
              "assistant turns (4 with their own system prompt); reference = a short assistant reply.")  # fmt: skip
    write_set(args.out, "sums", sums(rng),
              "GRPO task for a small instruct model: single-digit addition in chat form, 'Reply with "
              "only the number.'; reward = the reply's last integer equals 'answer'.")  # fmt: skip
    print(f"wrote chat ({len(chat)}) and sums ({SUMS_RECORDS}) to {args.out}")


if __name__ == "__main__":
    main()
