"""The sticky comment and the PR lookup, against the GitHub protocol fake (tests/github_server.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gate.errors import ConfigError
from gate.github.client import GitHubClient, GitHubError
from gate.github.comment import ACTIONS_BOT, decide, fit_body, resolve_author, upsert_comment
from gate.github.event import PullRequest, resolve_pull_request, verify_workflow_run_pr
from gate.render.budget import marker
from tests.github_server import FakeGitHub, Token

REPO = "acme/rl"
PR = 5
REPORT = Path(__file__).resolve().parent.parent / "e2e" / "data" / "report.json"


@pytest.fixture
def gh():
    tokens = {
        "user-token": Token("gate-bot"),
        "app-token": Token(None),
        "ro-token": Token(None, write=False),
    }
    with FakeGitHub(tokens) as server:
        server.add_pull(REPO, PR, head_sha="b" * 40, head_ref="bump-vllm", head_repo="fork/rl")
        yield server


def client(gh: FakeGitHub, token: str = "user-token") -> GitHubClient:
    return GitHubClient(token, gh.url, sleep=lambda s: None)


def body(gate_id: str = "cpu-default", text: str = "PASS") -> str:
    return f"{marker(gate_id)}\n## gate: {text}\n"


def upsert(
    gh, text="PASS", verdict="PASS", mode="always", gate_id="cpu-default", token="user-token", **kw
):
    with client(gh, token) as c:
        return upsert_comment(
            c, REPO, PR, body(gate_id, text), gate_id, verdict, mode, sleep=lambda s: None, **kw
        )


def writes(gh):
    return [r for r in gh.requests if r.method in ("POST", "PATCH")]


# -- create, update, unchanged -------------------------------------------------------------------
def test_first_run_creates_second_updates_the_same_comment(gh):
    first = upsert(gh, "PASS")
    assert first.action == "created" and first.url.endswith(f"#issuecomment-{first.id}")
    second = upsert(gh, "FAIL", verdict="FAIL")
    assert second.action == "updated" and second.id == first.id
    comments = gh.comments(REPO, PR)
    assert len(comments) == 1 and "FAIL" in comments[0]["body"]
    assert [r.method for r in writes(gh)] == ["POST", "PATCH"]


def test_unchanged_body_makes_no_write(gh):
    upsert(gh)
    n = len(writes(gh))
    result = upsert(gh)
    assert result.action == "unchanged" and len(writes(gh)) == n


def test_the_marker_is_added_when_missing(gh):
    with client(gh) as c:
        upsert_comment(c, REPO, PR, "no marker here", "g1", "PASS")
    assert gh.comments()[0]["body"].startswith("<!-- gate-report:g1 -->\n")


def test_a_comment_found_on_a_later_page(gh):
    upsert(gh)
    ours = gh.comments()[0]["id"]
    for i in range(230):
        gh.add_comment(REPO, PR, f"chatter {i}", "alice")
    # move ours to the end: delete and re-add after the chatter (ids grow, list is oldest first)
    gh.state.comments.pop(ours)
    gh.add_comment(REPO, PR, body(), "gate-bot")
    result = upsert(gh, "WARN", verdict="WARN")
    assert result.action == "updated"
    lists = [r for r in gh.calls("GET") if r.path.endswith("/comments")]
    assert len(lists) >= 4  # two lookups; the second walked 3 pages of 100
    assert sum(1 for c in gh.comments() if c["user"]["login"] == "gate-bot") == 1


def test_a_forged_marker_from_another_user_is_ignored(gh):
    gh.add_comment(REPO, PR, body(text="forged by a user"), "mallory")
    result = upsert(gh)
    assert result.action == "created"
    forged = [c for c in gh.comments() if c["user"]["login"] == "mallory"]
    assert forged[0]["body"].endswith("forged by a user\n")  # untouched


def test_one_comment_per_gate_id(gh):
    upsert(gh, gate_id="cpu")
    upsert(gh, gate_id="cpu-default")
    upsert(gh, "x", gate_id="cpu")
    comments = gh.comments()
    assert len(comments) == 2
    assert sorted(c["body"].split("\n")[0] for c in comments) == [
        marker("cpu"),
        marker("cpu-default"),
    ]


def test_marker_must_be_the_first_line(gh):
    gh.add_comment(REPO, PR, f"quoting:\n{marker('cpu-default')}", "gate-bot")
    assert upsert(gh).action == "created"


# -- author ---------------------------------------------------------------------------------------
def test_app_token_falls_back_to_github_actions_bot(gh):
    first = upsert(gh, token="app-token")
    second = upsert(gh, "changed", token="app-token")
    assert (first.action, second.action) == ("created", "updated")
    assert [c["user"]["login"] for c in gh.comments()] == [ACTIONS_BOT]
    assert [r.status for r in gh.calls("GET", "^/user$")] == [403, 403]


def test_a_github_app_token_finds_its_own_comment_again(gh):
    """An App's installation token: /user is 403, GraphQL's viewer names the bot; one comment, updated."""
    gh.tokens["my-app-token"] = Token(None, app="my-gate-app")
    first = upsert(gh, token="my-app-token")
    second = upsert(gh, "changed", verdict="FAIL", token="my-app-token")
    assert (first.action, second.action) == ("created", "updated") and first.id == second.id
    (comment,) = gh.comments()
    assert (
        comment["user"]["login"] == "my-gate-app[bot]"
        and comment["performed_via_github_app"]["slug"] == "my-gate-app"
    )
    assert [r.status for r in gh.calls("POST", "^/graphql$")] == [200, 200]


def test_graphql_login_without_bot_suffix_gets_the_rest_spelling(gh):
    gh.tokens["my-app-token"] = Token(None, app="my-gate-app", viewer="my-gate-app")
    with client(gh, "my-app-token") as c:
        assert resolve_author(c) == "my-gate-app[bot]"


def test_graphql_failure_falls_back_to_the_actions_bot(gh):
    gh.inject("POST", "^/graphql$", 404, message="Not Found")  # e.g. an old GHES
    with client(gh, "app-token") as c:
        assert resolve_author(c) == ACTIONS_BOT


def test_author_override_skips_the_user_lookup(gh):
    gh.add_comment(REPO, PR, body(text="old"), "gate-bot")
    result = upsert(gh, "new", author="gate-bot")
    assert result.action == "updated" and gh.calls("GET", "^/user$") == []


def test_a_bad_token_is_not_mistaken_for_an_app_token(gh):
    with pytest.raises(GitHubError) as err, client(gh, "nope") as c:
        resolve_author(c)
    assert err.value.status == 401


# -- races ----------------------------------------------------------------------------------------
def _rival(gh, login="gate-bot", text="rival"):
    """Another run of the same gate, creating its comment while we create ours."""
    return lambda g: g.add_comment(REPO, PR, body(text=text), login)


def test_a_race_where_the_other_run_posted_first_leaves_its_comment_with_our_body(gh):
    gh.before("POST", "/comments$", _rival(gh))  # the rival's comment is the older one
    result = upsert(gh, "ours", verdict="FAIL")
    (comment,) = gh.comments()
    assert (
        comment["body"] == body(text="ours")
        and result.id == comment["id"]
        and result.action == "created"
    )
    assert [r.status for r in gh.calls("DELETE")] == [204]


def test_a_race_where_we_posted_first_deletes_the_newer_duplicate(gh):
    gh.before("GET", "/comments$", lambda g: None)  # our first lookup: nothing yet
    gh.before(
        "GET", "/comments$", _rival(gh)
    )  # the rival posts after our create, before our second lookup
    result = upsert(gh, "ours")
    (comment,) = gh.comments()
    assert comment["body"] == body(text="ours") and comment["id"] == result.id
    assert gh.calls("PATCH") == [] and len(gh.calls("DELETE")) == 1


def test_duplicates_of_another_author_or_gate_are_left_alone(gh):
    gh.before("POST", "/comments$", lambda g: (g.add_comment(REPO, PR, body(text="x"), "mallory"),
                                                g.add_comment(REPO, PR, body("other-gate"), "gate-bot")))  # fmt: skip
    upsert(gh)
    assert len(gh.comments()) == 3 and gh.calls("DELETE") == []


def test_a_duplicate_the_other_run_already_deleted_is_fine(gh):
    gh.before("POST", "/comments$", _rival(gh))
    gh.inject("DELETE", "/issues/comments/", 404, message="Not Found")
    assert upsert(gh, "ours").action == "created"


# -- modes ----------------------------------------------------------------------------------------
EXISTING = {"id": 1, "body": "old"}


@pytest.mark.parametrize(
    ("mode", "verdict", "existing", "expected"),
    [
        ("always", "PASS", None, "create"),
        ("always", "PASS", EXISTING, "update"),
        ("on-change", "PASS", None, "skip"),
        ("on-change", "WARN", None, "create"),
        ("on-change", "FAIL", None, "create"),
        ("on-change", "PASS", EXISTING, "update"),
        ("on-failure", "PASS", None, "skip"),
        ("on-failure", "WARN", None, "skip"),
        ("on-failure", "FAIL", None, "create"),
        ("on-failure", "ERROR", None, "create"),
        ("on-failure", "PASS", EXISTING, "update"),  # a fixed PR's red comment turns green
        ("off", "FAIL", EXISTING, "skip"),
        ("always", "PASS", {"id": 1, "body": "new\r\n"}, "unchanged"),
        ("on-failure", "FAIL", {"id": 1, "body": "new"}, "unchanged"),
    ],
)
def test_decide(mode, verdict, existing, expected):
    assert decide(mode, verdict, existing, "new")[0] == expected


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError):
        decide("sometimes", "PASS", None, "x")


def test_mode_off_makes_no_request(gh):
    assert upsert(gh, mode="off").action == "skipped"
    assert gh.requests == []


def test_on_failure_pass_without_comment_only_reads(gh):
    result = upsert(gh, verdict="PASS", mode="on-failure")
    assert result.action == "skipped" and writes(gh) == []


# -- failures -------------------------------------------------------------------------------------
def test_a_lost_create_response_does_not_duplicate_the_comment(gh):
    gh.inject("POST", "/comments$", 502, after=True)  # created, but the client sees a 502
    result = upsert(gh)
    assert len(gh.comments()) == 1
    assert result.action == "unchanged" and result.id == gh.comments()[0]["id"]
    assert len(gh.calls("POST")) == 1


def test_a_5xx_before_the_create_is_retried(gh):
    gh.inject("POST", "/comments$", 503)
    assert upsert(gh).action == "created"
    assert [r.status for r in gh.calls("POST")] == [503, 201] and len(gh.comments()) == 1


def test_patch_retries_on_502(gh):
    upsert(gh)
    gh.inject("PATCH", "/issues/comments/", 502, times=2)
    assert upsert(gh, "changed").action == "updated"
    assert [r.status for r in gh.calls("PATCH")] == [502, 502, 200]


def test_secondary_rate_limit_on_create(gh):
    gh.inject(
        "POST",
        "/comments$",
        403,
        headers={"retry-after": "1"},
        message="You have exceeded a secondary rate limit",
    )
    assert upsert(gh).action == "created" and len(gh.comments()) == 1


def test_read_only_token_explains_the_fork_split(gh):
    with pytest.raises(GitHubError) as err:
        upsert(gh, token="ro-token")
    assert (
        err.value.status == 403
        and "workflow_run" in str(err.value)
        and "read-only" in str(err.value)
    )


def test_an_oversized_body_is_cut_to_fit_and_posted(gh):
    huge = marker("cpu-default") + "\n" + "y" * 100_000
    with client(gh) as c:
        result = upsert_comment(c, REPO, PR, huge, "cpu-default", "FAIL")
    posted = gh.comments()[0]["body"]
    assert result.action == "created" and len(posted) <= 65_536 and "truncated" in posted
    assert fit_body("short") == "short"


# -- which PR -------------------------------------------------------------------------------------
def _env(tmp_path: Path, event_name: str, payload: dict, repo: str = REPO) -> dict[str, str]:
    path = tmp_path / "event.json"
    path.write_text(json.dumps(payload))
    return {
        "GITHUB_EVENT_NAME": event_name,
        "GITHUB_EVENT_PATH": str(path),
        "GITHUB_REPOSITORY": repo,
    }


@pytest.mark.parametrize("event", ["pull_request", "pull_request_target"])
def test_pr_number_from_pull_request_events(tmp_path, event):
    pr = resolve_pull_request(_env(tmp_path, event, {"pull_request": {"number": 42}}))
    assert (pr.repo, pr.number, pr.source) == (REPO, 42, "event")


def test_pr_number_from_workflow_run(tmp_path):
    payload = {"workflow_run": {"pull_requests": [{"number": 9}], "head_sha": "c" * 40}}
    pr = resolve_pull_request(_env(tmp_path, "workflow_run", payload))
    assert pr.number == 9 and pr.head_sha == "c" * 40


def test_workflow_run_from_a_fork_reads_the_pr_number_file(tmp_path):
    payload = {"workflow_run": {"pull_requests": [], "head_sha": "b" * 40,
                                "head_repository": {"full_name": "fork/rl"}, "head_branch": "bump-vllm"}}  # fmt: skip
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    (artifact / "pr-number").write_text("5\n")
    pr = resolve_pull_request(_env(tmp_path, "workflow_run", payload), search_dirs=(artifact,))
    assert (pr.number, pr.source, pr.head_repo, pr.head_branch) == (
        5,
        "file",
        "fork/rl",
        "bump-vllm",
    )


def test_explicit_pr_number_wins_and_is_validated(tmp_path):
    env = _env(tmp_path, "pull_request", {"pull_request": {"number": 42}})
    assert resolve_pull_request(env, pr_number="7").number == 7
    with pytest.raises(ConfigError, match="not a pull request number"):
        resolve_pull_request(env, pr_number="7; rm -rf /")


def test_a_forged_pr_number_file_is_refused(tmp_path):
    (tmp_path / "pr-number").write_text("abc")
    env = _env(tmp_path, "workflow_run", {"workflow_run": {"pull_requests": []}})
    with pytest.raises(ConfigError, match="not a pull request number"):
        resolve_pull_request(env, search_dirs=(tmp_path,))


def test_no_pr_number_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no pull request number: event 'push'"):
        resolve_pull_request(_env(tmp_path, "push", {"ref": "refs/heads/main"}))


def test_repository_is_required(tmp_path):
    with pytest.raises(ConfigError, match="GITHUB_REPOSITORY"):
        resolve_pull_request(
            _env(tmp_path, "pull_request", {"pull_request": {"number": 1}}, repo="nope")
        )


def test_artifact_pr_number_is_checked_against_the_run_head(gh):
    base = dict(repo=REPO, number=PR, event_name="workflow_run", source="file")
    with client(gh) as c:
        verify_workflow_run_pr(c, PullRequest(**base, head_sha="b" * 40))  # same head
        # the PR moved on since the run, but it is the same branch of the same fork
        verify_workflow_run_pr(
            c, PullRequest(**base, head_sha="d" * 40, head_repo="fork/rl", head_branch="bump-vllm")
        )
        with pytest.raises(ConfigError, match="refusing to comment"):
            verify_workflow_run_pr(
                c, PullRequest(**base, head_sha="e" * 40, head_repo="evil/rl", head_branch="x")
            )


# -- the command ----------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    from gate.commands.github import register

    parser = argparse.ArgumentParser(prog="gate")
    register(parser.add_subparsers())
    return parser


@pytest.fixture
def actions_env(gh, tmp_path, monkeypatch):
    env = _env(tmp_path, "pull_request", {"pull_request": {"number": PR}})
    env |= {
        "GITHUB_API_URL": gh.url,
        "GITHUB_TOKEN": "app-token",
        "GITHUB_OUTPUT": str(tmp_path / "output"),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def test_gate_comment_command_creates_then_updates(gh, actions_env, tmp_path, capsys):
    args = _parser().parse_args(["comment", str(REPORT)])
    assert args.func(args) == 0
    comments = gh.comments()
    assert len(comments) == 1 and comments[0]["body"].startswith("<!-- gate-report:cpu-default -->")
    assert len(comments[0]["body"]) <= 65_536
    assert "app-token" not in capsys.readouterr().err
    output = Path(actions_env["GITHUB_OUTPUT"]).read_text()
    assert f"comment-url={comments[0]['html_url']}" in output and "comment-action=created" in output

    report = json.loads(REPORT.read_text())
    report["verdict"] = "FAIL"
    report["checks"][0]["status"] = "FAIL"
    changed = tmp_path / "report.json"
    changed.write_text(json.dumps(report))
    args = _parser().parse_args(["comment", str(changed), "--mode", "on-change"])
    assert args.func(args) == 0
    assert len(gh.comments()) == 1 and gh.comments()[0]["id"] == comments[0]["id"]
    assert "comment-action=updated" in Path(actions_env["GITHUB_OUTPUT"]).read_text()


def test_gate_comment_gate_id_override_and_off(gh, actions_env):
    parser = _parser()
    args = parser.parse_args(["comment", str(REPORT), "--gate-id", "matrix-qwen"])
    args.func(args)
    assert gh.comments()[0]["body"].startswith(marker("matrix-qwen"))
    n = len(gh.requests)
    args = parser.parse_args(["comment", str(REPORT), "--mode", "off"])
    assert args.func(args) == 0 and len(gh.requests) == n


def test_a_gate_id_cannot_break_the_marker(gh, actions_env):
    args = _parser().parse_args(["comment", str(REPORT), "--gate-id", "x --> <b>"])
    args.func(args)
    args.func(args)  # found again by the same reduced id
    (comment,) = gh.comments()
    first = comment["body"].split("\n", 1)[0]
    assert first == marker("x --> <b>") and first.count("-->") == 1 and "<b>" not in first


def test_gate_comment_without_token_is_a_one_line_error(gh, actions_env, monkeypatch, capsys):
    from gate.cli import main

    monkeypatch.delenv("GITHUB_TOKEN")
    monkeypatch.delenv("GH_TOKEN", raising=False)
    assert main(["comment", str(REPORT)]) == 2  # configuration, not GitHub: exit 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no GitHub token" in err[0]


def test_gate_comment_under_workflow_run_for_a_fork_pr(gh, tmp_path, monkeypatch):
    """The fork split's second half: PR number from the artifact, checked against the run's head."""
    artifact = tmp_path / "gate-report"
    artifact.mkdir()
    (artifact / "report.json").write_text(REPORT.read_text())
    (artifact / "pr-number").write_text(f"{PR}\n")
    run = {"pull_requests": [], "head_sha": "b" * 40, "head_branch": "bump-vllm",
           "head_repository": {"full_name": "fork/rl"}}  # fmt: skip
    env = _env(tmp_path, "workflow_run", {"workflow_run": run}) | {
        "GITHUB_API_URL": gh.url,
        "GITHUB_TOKEN": "app-token",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("GITHUB_OUTPUT", raising=False)
    args = _parser().parse_args(["comment", str(artifact / "report.json")])
    assert args.func(args) == 0
    assert [c["_issue"] for c in gh.comments()] == [PR]
    assert gh.calls("GET", f"/pulls/{PR}$")  # verified before commenting

    (artifact / "pr-number").write_text("6\n")  # a PR the run was not about
    gh.add_pull(REPO, 6, head_sha="f" * 40, head_ref="main", head_repo=REPO)
    with pytest.raises(ConfigError, match="refusing to comment"):
        args.func(args)
    assert len(gh.comments()) == 1


def test_gate_comment_on_a_push_event_skips(gh, tmp_path, monkeypatch, capsys):
    env = _env(tmp_path, "push", {"ref": "refs/heads/main"}) | {
        "GITHUB_API_URL": gh.url,
        "GITHUB_TOKEN": "app-token",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "output"))
    args = _parser().parse_args(["comment", str(REPORT)])
    assert args.func(args) == 0
    assert "not about a pull request" in capsys.readouterr().err
    assert gh.requests == [] and "comment-action=skipped" in (tmp_path / "output").read_text()
