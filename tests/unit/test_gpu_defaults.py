"""The GPU defaults users copy: the Dockerfile's engine specs, the GPU example config and the
example workflows name one pair of vLLM releases, and it is a current one.

A gate that ships year-old defaults tests upgrades nobody is making. CURRENT_GPU_PAIR is the newest
two vLLM minor releases on PyPI when it was last reviewed (vllm 0.34.0 was the newest, built 2026-11-16);
when a new minor release ships, move the pair here and in every file this test reads.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gate.config import DockerConfig

REPO = Path(__file__).resolve().parents[2]
CURRENT_GPU_PAIR = ("vllm==0.33.0", "vllm==0.34.0")


def _dockerfile_args() -> dict[str, str]:
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    return dict(re.findall(r"^ARG (\w+)=(\S*)$", text, flags=re.MULTILINE))


def _workflow_specs() -> dict[str, set[str]]:
    """Every old-spec / new-spec an example workflow passes to the action."""
    found: dict[str, set[str]] = {"old-spec": set(), "new-spec": set()}
    for path in sorted((REPO / "examples" / "workflows").glob("*.yml")):
        for job in (yaml.safe_load(path.read_text(encoding="utf-8")).get("jobs") or {}).values():
            for step in job.get("steps") or []:
                for key in found:
                    if key in (step.get("with") or {}):
                        found[key].add(str(step["with"][key]))
    return found


def test_the_dockerfile_builds_the_current_pair_by_default():
    args = _dockerfile_args()
    assert (args["VLLM_OLD"], args["VLLM_NEW"]) == CURRENT_GPU_PAIR
    assert (
        f"VLLM_OLD={CURRENT_GPU_PAIR[0]} --build-arg VLLM_NEW={CURRENT_GPU_PAIR[1]}"
        in (REPO / "Dockerfile").read_text()
    )


def test_the_gpu_example_config_gates_the_current_pair():
    engines = yaml.safe_load((REPO / "examples" / "gpu-qwen.yaml").read_text(encoding="utf-8"))[
        "engines"
    ]
    assert (engines["old"]["spec"], engines["new"]["spec"]) == CURRENT_GPU_PAIR


def test_the_example_workflows_gate_the_current_pair():
    specs = _workflow_specs()
    assert specs["old-spec"] == {CURRENT_GPU_PAIR[0]} and specs["new-spec"] == {
        CURRENT_GPU_PAIR[1]
    }, specs


def test_the_config_default_base_image_is_the_dockerfiles():
    # Pinning the base by digest means changing both: the config's default is what gate builds with.
    assert DockerConfig().base_image == _dockerfile_args()["BASE_IMAGE"]
