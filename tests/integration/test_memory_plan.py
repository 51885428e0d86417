"""The memory plan against the worker's measured peak, on the generated mid-size Llama (60 M params).

One engine (``--only new``), the CPU default's passes at a small size: sampling, greedy, teacher
forcing, the weight-sync probe and a 2-step GRPO run, then the reference. The plan (run.json) must be
within +-25% of the peak RSS the worker recorded per phase (engine.json ``memory_peaks``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import replay

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import make_mid_model  # noqa: E402

pytestmark = pytest.mark.engine
TOLERANCE = 0.25
# The worker's phase names (gate.worker.memory, one per engine pass) grouped into the plan's phases.
PLAN_PHASE = {
    "engine_start": "engine",
    "sample": "engine",
    "greedy": "engine",
    "teacher_forced": "engine",
    "weight_sync_inflight": "weight_sync",  # the same trainer model and two state dicts
}


@pytest.fixture(scope="module")
def mid_run(tmp_path_factory) -> tuple[dict, dict]:
    if "memory_peaks" not in (REPO / "gate" / "worker" / "main.py").read_text():
        # Four minutes of engine time on 2 cores would buy nothing to compare against.
        pytest.skip("the worker does not record memory_peaks yet (gate.worker.memory.PeakMemory "
                    "wired into gate/worker/main.py and passes.py)")  # fmt: skip
    cache = Path(os.environ.get("GATE_CACHE_DIR") or Path.home() / ".cache" / "gate")
    model = cache / "models" / "mid-llama"
    make_mid_model.main(["--out", str(model)])  # kept when already made alike
    raw = yaml.safe_load((REPO / "scripts" / "mid-llama.yaml").read_text())
    raw["model"]["path"] = str(model)
    raw["prompts"] = [str((REPO / "scripts" / p).resolve()) for p in raw["prompts"]]
    raw["sampling"]["n"] = 2
    raw["grpo"] |= {"steps": 2}
    tmp = tmp_path_factory.mktemp("mid")
    config = tmp / "mid-llama.yaml"
    config.write_text(yaml.safe_dump(raw))
    result = replay(tmp / "run", "-c", str(config), "--only", "new")
    assert "memory plan: " in result.stderr  # printed at the start
    meta = json.loads((result.run_dir / "engines" / "new" / "engine.json").read_text())
    return result.manifest["memory_plan"], meta


def test_plan_is_in_run_json(mid_run) -> None:
    plan, _ = mid_run
    assert plan["parameters"] == 59_978_496 and plan["parameters_from"] == "safetensors header"
    assert plan["fits"] is True
    assert set(plan["engines"][0]["phases"]) == {"engine", "weight_sync", "grpo", "reference"}


def test_plan_is_within_25_percent_of_the_measured_peak(mid_run) -> None:
    plan, meta = mid_run
    peaks = meta.get("memory_peaks")
    if not peaks:
        pytest.skip("engine.json has no memory_peaks: the worker does not record them yet "
                    "(gate.worker.memory.PeakMemory in gate/worker/main.py and passes.py)")  # fmt: skip
    measured: dict[str, int] = {}
    for name, values in peaks["phases"].items():
        phase = PLAN_PHASE.get(name, name)
        measured[phase] = max(measured.get(phase, 0), values["rss_peak_bytes"])
    group = plan["engines"][0]
    device = group["devices"][0]["name"]
    planned = {name: per[device]["total_bytes"] for name, per in group["phases"].items()}
    off = {p: planned[p] / measured[p] - 1 for p in planned if measured.get(p)}
    assert off, (planned, measured)
    assert all(abs(v) <= TOLERANCE for v in off.values()), off
    peak = max(planned.values()) / max(measured.values()) - 1
    assert abs(peak) <= TOLERANCE, peak
