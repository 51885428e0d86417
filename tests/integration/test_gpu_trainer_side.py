"""The trainer side on a CUDA GPU: scripts/gpu_reference_check.py on the CPU default's evidence.

The reference scorer and the GRPO trainer run on the GPU and are held to the CPU reference the run
recorded; the script's own bounds decide (docs/docker-and-gpu.md has one H200 run's figures).
Skipped where no NVIDIA GPU is, and where the test environment's torch sees none.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from .conftest import REPO, Replay

pytestmark = [pytest.mark.gpu, pytest.mark.engine]

NO_GPU = 2  # the script's exit code where torch sees no CUDA device


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no NVIDIA GPU on this machine")
def test_the_reference_and_grpo_on_cuda_hold_to_the_cpu_reference(default_replay: Replay, tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_reference_check.py"),
         "--evidence", str(default_replay.run_dir / "engines" / "new"), "--out", str(out)],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    if proc.returncode == NO_GPU:
        pytest.skip(f"the test environment's torch sees no CUDA device: {proc.stderr.strip()}")
    found = json.loads(out.read_text())
    failed = {
        name: part for name, part in found.items() if isinstance(part, dict) and not part.get("ok")
    }
    assert proc.returncode == 0 and not failed, (failed, proc.stdout[-3000:])
