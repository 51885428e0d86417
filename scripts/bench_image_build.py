"""Benchmark the gate image build: wall time, per-step times and image size.

Builds the CPU flavour of the root Dockerfile (the built-in CPU default's specs and system packages,
on the debootstrap base from scripts/make_base_image.sh) through the Docker SDK, as
`gate run --runner docker` does, from the same build context and build arguments:

    python scripts/bench_image_build.py                 # cold: --no-cache (the base image excluded)
    python scripts/bench_image_build.py --warm          # layer cache on
    python scripts/bench_image_build.py --warm --touch  # cache on, gate's code changed (a comment)

The image is tagged as gate would tag it, so a later `gate run --runner docker` reuses it (except
after --touch, which tags <tag>-touched). Prints a table; --json writes the figures too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gate.config import BUILTIN_CONFIG, load_config
from gate.docker.image import ImageRecipe, _write_context, source_root

STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # the classic builder's red for a RUN's stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default="gate-base:bookworm")
    parser.add_argument("--network", default="host")
    parser.add_argument(
        "--warm", action="store_true", help="use the layer cache (default: --no-cache)"
    )
    parser.add_argument(
        "--touch", action="store_true", help="change gate's code (a comment) in the build context"
    )
    parser.add_argument("--tag", help="default: the tag gate gives this recipe")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "gate-bench-image-build.log",
                        help="the whole build output (default: %(default)s)")  # fmt: skip
    args = parser.parse_args()

    import docker

    client = docker.from_env()
    recipe = dataclasses.replace(
        ImageRecipe.from_config(load_config(BUILTIN_CONFIG)), base_image=args.base_image
    )
    root = source_root()
    tag = args.tag or recipe.tag(root) + ("-touched" if args.touch else "")
    steps: list[dict] = []
    start = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="gate-bench-build-") as context,
        open(args.log, "w") as log,
    ):
        _write_context(root, Path(context))
        if args.touch:
            init = Path(context) / "gate" / "__init__.py"
            init.write_text(init.read_text() + f"# bench_image_build --touch {time.time()}\n")
        stream = client.api.build(
            path=context, tag=tag, buildargs=recipe.build_args(), network_mode=args.network,
            nocache=not args.warm, rm=True, forcerm=True, pull=False, decode=True,
        )  # fmt: skip
        for chunk in stream:
            if "error" in chunk or "errorDetail" in chunk:
                print(
                    chunk.get("error") or chunk["errorDetail"].get("message"),
                    f"(log: {args.log})",
                    file=sys.stderr,
                )
                return 1
            for line in COLOUR.sub("", chunk.get("stream", "")).splitlines():
                now = time.perf_counter() - start
                log.write(f"{now:7.1f} {line}\n")
                log.flush()
                match = STEP.match(line)
                if match:
                    if steps:
                        steps[-1]["s"] = round(now - steps[-1]["at"], 1)
                    steps.append(
                        {
                            "step": int(match[1]),
                            "of": int(match[2]),
                            "what": match[3],
                            "at": now,
                            "s": None,
                        }
                    )
                    print(f"{now:6.0f}s  {line[:150]}", file=sys.stderr, flush=True)
                elif (
                    steps
                    and steps[-1]["what"].startswith("RUN")
                    and re.match(r"^\[(old|new)\] ", line)
                ):
                    print(f"{now:6.0f}s    {line[:150]}", file=sys.stderr, flush=True)
    wall = time.perf_counter() - start
    if steps:
        steps[-1]["s"] = round(wall - steps[-1]["at"], 1)
    image = client.images.get(tag)
    layers = client.api.history(tag)
    figures = {
        "tag": tag,
        "mode": "warm" if args.warm else "cold",
        "touched": args.touch,
        "wall_s": round(wall, 1),
        "size_bytes": image.attrs["Size"],
        "base_size_bytes": client.images.get(args.base_image).attrs["Size"],
        "steps": [{k: v for k, v in s.items() if k != "at"} for s in steps],
        "largest_layers": sorted(
            (
                {"size_bytes": layer["Size"], "created_by": layer["CreatedBy"][-110:]}
                for layer in layers
            ),
            key=lambda layer: -layer["size_bytes"],
        )[:4],
    }
    print(f"\n{'step':>9}  {'seconds':>8}  instruction")
    for s in figures["steps"]:
        if s["s"] is not None and s["s"] >= 1:
            print(f"{s['step']:>4}/{s['of']:<4}  {s['s']:>8.1f}  {s['what'][:100]}")
    print("\nlargest layers:")
    for layer in figures["largest_layers"]:
        print(f"  {layer['size_bytes'] / 1e9:6.2f} GB  {layer['created_by']}")
    print(
        f"\n{figures['mode']} build{' (code touched)' if args.touch else ''}: {wall:.0f} s; "
        f"image {figures['size_bytes'] / 1e9:.2f} GB (base {figures['base_size_bytes'] / 1e9:.2f} GB); {tag}; log: {args.log}"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
