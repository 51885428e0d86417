"""Which pull request and repository a workflow run is about, from the Actions environment.

- ``$GITHUB_REPOSITORY`` (``owner/name``; the event's ``repository.full_name`` as a fallback).
- The PR number from the event JSON at ``$GITHUB_EVENT_PATH``: ``pull_request.number`` for
  ``pull_request`` and ``pull_request_target``; ``workflow_run.pull_requests[0].number`` for
  ``workflow_run``. For a fork PR that list is empty, so the ``pull_request`` job uploads the number
  in a ``pr-number`` file beside report.json and the ``workflow_run`` job passes it on (``--pr-number``
  or ``--pr-number-file``; a ``pr-number`` file next to the report is found by itself).

Under ``workflow_run`` a number that came from an artifact was written by the PR's own workflow run,
i.e. by code the PR controls, and one passed as an argument or input was often read from that
artifact: :func:`verify_workflow_run_pr` checks both against the triggering run's head before anyone
comments. When the artifact is missing altogether, :func:`find_run_pr` asks the API which open PR has
the run's head. :func:`workflow_run` gives the trusted facts about that run (conclusion, head, link).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate.errors import ConfigError

PR_NUMBER_FILE = "pr-number"
_PR_NUMBER_RE = re.compile(r"[0-9]{1,10}")  # ASCII only: str.isdigit() also accepts "²" and "٣"
_REPO_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


# Events that are never about one pull request: `gate comment` has nothing to do there.
NON_PR_EVENTS = frozenset(
    {"push", "schedule", "workflow_dispatch", "merge_group", "release", "repository_dispatch"}
)


class NoPullRequest(ConfigError):
    """The event carries no PR number and none was given."""

    def __init__(self, message: str, event_name: str) -> None:
        super().__init__(message)
        self.event_name = event_name


@dataclass(frozen=True)
class PullRequest:
    repo: str  # owner/name
    number: int
    event_name: str
    source: str  # where the number came from: "event", "argument", "file"
    head_sha: str | None = (
        None  # workflow_run: the triggering run's head commit, repository, branch
    )
    head_repo: str | None = None
    head_branch: str | None = None


@dataclass(frozen=True)
class WorkflowRun:
    """The run that triggered a ``workflow_run`` event, as GitHub describes it in $GITHUB_EVENT_PATH."""

    base_repo: str  # owner/name of the repository this job runs in
    head_sha: str | None
    head_repo: str | None
    head_branch: str | None
    conclusion: str | None
    html_url: str | None
    id: int | None

    @property
    def from_fork(self) -> bool:
        """The run's code came from another repository: its artifact is the PR's word, nothing more."""
        return self.head_repo != self.base_repo


def workflow_run(env: Mapping[str, str] | None = None) -> WorkflowRun | None:
    """The triggering run under a ``workflow_run`` event; None for any other event."""
    env = os.environ if env is None else env
    event_name, payload = load_event(env)
    run = payload.get("workflow_run")
    if event_name != "workflow_run" or not isinstance(run, dict):
        return None
    repo = (
        env.get("GITHUB_REPOSITORY")
        or _str((payload.get("repository") or {}).get("full_name"))
        or ""
    )
    head_repository = run.get("head_repository")
    head_repo = head_repository if isinstance(head_repository, dict) else {}
    return WorkflowRun(
        base_repo=repo,
        head_sha=_str(run.get("head_sha")),
        head_repo=_str(head_repo.get("full_name")),
        head_branch=_str(run.get("head_branch")),
        conclusion=_str(run.get("conclusion")),
        html_url=_str(run.get("html_url")),
        id=run.get("id") if isinstance(run.get("id"), int) else None,
    )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def load_event(env: Mapping[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """(event name, event payload) from the Actions environment; an empty payload outside Actions."""
    env = os.environ if env is None else env
    name = env.get("GITHUB_EVENT_NAME", "")
    path = env.get("GITHUB_EVENT_PATH")
    if not path:
        return name, {}
    try:
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"GITHUB_EVENT_PATH={path}: cannot read the event JSON ({exc})") from None
    if not isinstance(payload, dict):
        raise ConfigError(f"GITHUB_EVENT_PATH={path}: the event JSON is not an object")
    if not name:  # act and hand-made environments may omit it: infer from the payload
        name = next(
            (k for k in ("pull_request", "workflow_run") if isinstance(payload.get(k), dict)), ""
        )
    return name, payload


def parse_pr_number(text: str, where: str) -> int:
    """A positive number of ASCII digits; anything else (it may come from a PR's artifact) is a ConfigError."""
    value = text.strip()
    if not _PR_NUMBER_RE.fullmatch(value) or int(value) <= 0:
        shown = json.dumps(value[:40], ensure_ascii=True)  # one line, whatever the file holds
        raise ConfigError(
            f"{where}: {shown} is not a pull request number (expected a positive number of digits 0-9)"
        )
    return int(value)


def resolve_pull_request(
    env: Mapping[str, str] | None = None,
    pr_number: int | str | None = None,
    pr_number_file: Path | None = None,
    search_dirs: tuple[Path, ...] = (),
) -> PullRequest:
    """The repository and PR number this run should comment on; a :class:`ConfigError` when unknown.

    Precedence: an explicit ``pr_number``, the event JSON, ``pr_number_file``, a ``pr-number`` file in
    one of ``search_dirs`` (the report's folder).
    """
    env = os.environ if env is None else env
    event_name, payload = load_event(env)
    repo = env.get("GITHUB_REPOSITORY") or (payload.get("repository") or {}).get("full_name") or ""
    if not _REPO_RE.match(repo):
        raise ConfigError(
            f"GITHUB_REPOSITORY: '{repo}' is not owner/name (is this running in GitHub Actions?)"
        )
    run = payload.get("workflow_run") if isinstance(payload.get("workflow_run"), dict) else None
    head = {}
    if run:
        head = {
            "head_sha": run.get("head_sha"),
            "head_repo": (run.get("head_repository") or {}).get("full_name"),
            "head_branch": run.get("head_branch"),
        }

    if pr_number not in (None, ""):
        return PullRequest(
            repo, parse_pr_number(str(pr_number), "--pr-number"), event_name, "argument", **head
        )
    number = _number_from_event(event_name, payload)
    if number is not None:
        return PullRequest(repo, number, event_name, "event", **head)
    candidates = ([pr_number_file] if pr_number_file else []) + [
        d / PR_NUMBER_FILE for d in search_dirs
    ]
    for path in candidates:
        if path.is_file():
            with open(
                path, "rb"
            ) as f:  # a number is short; the file is the PR's, so read no more than that
                text = f.read(64).decode("utf-8", errors="replace")
            return PullRequest(repo, parse_pr_number(text, str(path)), event_name, "file", **head)
        if path == pr_number_file:
            raise ConfigError(f"{path}: PR number file not found")
    raise NoPullRequest(
        f"no pull request number: event '{event_name or 'unknown'}' carries none (GITHUB_EVENT_PATH="
        f"{env.get('GITHUB_EVENT_PATH', 'unset')}); pass --pr-number, or put a '{PR_NUMBER_FILE}' file beside "
        "the report (the fork split's artifact does)",
        event_name,
    )


def _number_from_event(event_name: str, payload: dict[str, Any]) -> int | None:
    if event_name in (
        "pull_request",
        "pull_request_target",
        "pull_request_review",
        "pull_request_review_comment",
    ):
        pr = payload.get("pull_request")
        if isinstance(pr, dict) and isinstance(pr.get("number"), int):
            return pr["number"]
    if event_name == "workflow_run":
        prs = (payload.get("workflow_run") or {}).get("pull_requests") or []
        if prs and isinstance(prs[0], dict) and isinstance(prs[0].get("number"), int):
            return prs[0]["number"]
    if event_name == "issue_comment":
        issue = payload.get("issue")
        if (
            isinstance(issue, dict)
            and issue.get("pull_request")
            and isinstance(issue.get("number"), int)
        ):
            return issue["number"]
    if not event_name:  # unknown event name: take a pull_request payload when there is one
        pr = payload.get("pull_request")
        if isinstance(pr, dict) and isinstance(pr.get("number"), int):
            return pr["number"]
    return None


def verify_workflow_run_pr(client: Any, pr: PullRequest) -> None:
    """Under ``workflow_run``, for a number not taken from the event: the PR's head must be the run's head.

    The artifact was produced by the PR's own (untrusted) workflow run, and a number passed as an
    argument or input is usually read from it; without this check a PR could name another PR's number
    and have the privileged job comment there. The event's own ``pull_requests`` is GitHub's word.
    """
    if pr.event_name != "workflow_run" or pr.source == "event":
        return
    if not pr.head_sha:
        raise ConfigError(
            f"PR #{pr.number}: the workflow_run event names no head_sha to check the number against; refusing to comment"
        )
    data = client.get_json(f"repos/{pr.repo}/pulls/{pr.number}")
    head = (data.get("head") or {}) if isinstance(data, dict) else {}
    if head.get("sha") == pr.head_sha:
        return
    # A push after the run moves the PR's head; the PR's branch (repository + ref) still identifies it.
    repo = (head.get("repo") or {}).get("full_name")
    if (
        pr.head_repo
        and pr.head_branch
        and repo == pr.head_repo
        and head.get("ref") == pr.head_branch
    ):
        return
    origin = f"the artifact's {PR_NUMBER_FILE} file" if pr.source == "file" else "--pr-number"
    raise ConfigError(
        f"PR #{pr.number} (from {origin}) is {_shown(repo)}:{_shown(head.get('ref'))} at "
        f"{_shown(head.get('sha'))[:12]}, but the workflow run that triggered this job ran on "
        f"{_shown(pr.head_repo)}:{_shown(pr.head_branch)} at {pr.head_sha[:12]}: refusing to comment"
    )


def find_run_pr(client: Any, run: WorkflowRun) -> int | None:
    """The open PR of ``run.base_repo`` whose head is the run's head (repository and branch); None if none.

    For a fork's run the event's ``pull_requests`` is empty; when its artifact is missing too, this is
    the only trustworthy way to the PR: the number comes from GitHub, not from the PR.
    """
    if not (run.head_repo and run.head_branch and "/" in run.head_repo):
        return None
    owner = run.head_repo.split("/", 1)[0]
    pulls = client.get_json(
        f"repos/{run.base_repo}/pulls", {"head": f"{owner}:{run.head_branch}", "state": "open"}
    )
    for pull in pulls if isinstance(pulls, list) else []:
        head = pull.get("head") if isinstance(pull, dict) else None
        if not isinstance(head, dict) or not isinstance(pull.get("number"), int):
            continue
        if (head.get("repo") or {}).get("full_name") == run.head_repo and head.get(
            "ref"
        ) == run.head_branch:
            return pull["number"]
    return None


def _shown(value: Any) -> str:
    """A value from the API or the event in a one-line message (a branch name is the PR author's text)."""
    return json.dumps(value, ensure_ascii=True)[1:-1] if isinstance(value, str) else str(value)
