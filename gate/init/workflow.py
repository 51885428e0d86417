"""The pull-request workflow `gate init` writes: examples/workflows/gate-self-hosted.yml, filled in.

The template (templates/vllm-gate.yml) is that example with four blanks: the paths whose change
starts the gate, gate.yaml's path, and the old and new engine specs. The example in the repository
is the template filled with the README's values; tests/unit/test_init.py keeps the two equal, and
``python -m gate.init.workflow`` writes the example again after the template changes.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "templates" / "vllm-gate.yml"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "workflows" / "gate-self-hosted.yml"
# Where `gate init` puts it, from the repository's root.
WORKFLOW = Path(".github") / "workflows" / "vllm-gate.yml"
# What changes an engine or its settings in most repositories, besides gate's own files.
DEPENDENCY_FILES = ("requirements*.txt", "pyproject.toml", "uv.lock")


@dataclass(frozen=True)
class WorkflowValues:
    config: str  # gate.yaml, from the repository's root
    old_spec: str
    new_spec: str
    watched: tuple[str, ...]  # path patterns whose change in a PR starts the gate


README_VALUES = WorkflowValues(
    "gate.yaml", "vllm==0.33.0", "vllm==0.34.0", (*DEPENDENCY_FILES, "gate.yaml", "baselines/**")
)


def render(values: WorkflowValues) -> str:
    # JSON strings are YAML double-quoted scalars: a path or spec cannot break out of its field.
    watched = "\n".join(f"      - {json.dumps(p)}" for p in dict.fromkeys(values.watched))
    text = TEMPLATE.read_text(encoding="utf-8")
    for blank, value in (
        ("@@WATCHED@@", watched),
        ("@@CONFIG@@", _scalar(values.config)),
        ("@@OLD_SPEC@@", _scalar(values.old_spec)),
        ("@@NEW_SPEC@@", _scalar(values.new_spec)),
    ):
        text = text.replace(blank, value)
    return text


def _scalar(value: str) -> str:
    """Plain where YAML reads it back as the same string (as the example has it), quoted otherwise."""
    plain = all(c.isalnum() or c in "._-/=<>!~,*" for c in value) and value[:1].isalnum()
    return value if plain else json.dumps(value)


def main() -> int:
    """Write the example from the template: after the template changes, review the diff and commit."""
    if not EXAMPLE.parent.is_dir():
        print(f"error: {EXAMPLE.parent}: not a gate source checkout", file=sys.stderr)
        return 2
    EXAMPLE.write_text(render(README_VALUES), encoding="utf-8")
    print(EXAMPLE, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
