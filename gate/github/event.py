"""Which pull request and repository a workflow run is about, from the Actions environment.

- ``$GITHUB_REPOSITORY`` (``owner/name``; the event's ``repository.full_name`` as a fallback).
- The PR number from the event JSON at ``$GITHUB_EVENT_PATH``: ``pull_request.number`` for
  ``pull_request`` and ``pull_request_target``; ``workflow_run.pull_requests[0].number`` for
  ``workflow_run``. For a fork PR that list is empty, so the ``pull_request`` job uploads the number
  in a ``pr-number`` file beside report.json and the ``workflow_run`` job passes it on (``--pr-number``
  or ``--pr-number-file``; a ``pr-number`` file next to the report is found by itself).

A number that came from an artifact was written by the PR's own workflow run, i.e. by code the PR
controls: :func:`verify_workflow_run_pr` checks it against the triggering run's head SHA before anyone
comments on it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate.errors import ConfigError

PR_NUMBER_FILE = "pr-number"
_REPO_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


# Events that are never about one pull request: `gate comment` has nothing to do there.
NON_PR_EVENTS = frozenset({"push", "schedule", "workflow_dispatch", "merge_group", "release", "repository_dispatch"})


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
    head_sha: str | None = None  # workflow_run: the triggering run's head commit, repository, branch
    head_repo: str | None = None
    head_branch: str | None = None


def load_event(env: dict[str, str] | None = None) -> tuple[str, dict[str, Any]]:
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
        name = next((k for k in ("pull_request", "workflow_run") if isinstance(payload.get(k), dict)), "")
    return name, payload


def parse_pr_number(text: str, where: str) -> int:
    value = text.strip()
    if not value.isdigit() or int(value) <= 0:
        raise ConfigError(f"{where}: '{value[:40]}' is not a pull request number")
    return int(value)


def resolve_pull_request(
    env: dict[str, str] | None = None,
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
        raise ConfigError(f"GITHUB_REPOSITORY: '{repo}' is not owner/name (is this running in GitHub Actions?)")
    run = payload.get("workflow_run") if isinstance(payload.get("workflow_run"), dict) else None
    head = {}
    if run:
        head = {
            "head_sha": run.get("head_sha"),
            "head_repo": (run.get("head_repository") or {}).get("full_name"),
            "head_branch": run.get("head_branch"),
        }

    if pr_number not in (None, ""):
        return PullRequest(repo, parse_pr_number(str(pr_number), "--pr-number"), event_name, "argument", **head)
    number = _number_from_event(event_name, payload)
    if number is not None:
        return PullRequest(repo, number, event_name, "event", **head)
    candidates = ([pr_number_file] if pr_number_file else []) + [d / PR_NUMBER_FILE for d in search_dirs]
    for path in candidates:
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
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
    if event_name in ("pull_request", "pull_request_target", "pull_request_review", "pull_request_review_comment"):
        pr = payload.get("pull_request")
        if isinstance(pr, dict) and isinstance(pr.get("number"), int):
            return pr["number"]
    if event_name == "workflow_run":
        prs = (payload.get("workflow_run") or {}).get("pull_requests") or []
        if prs and isinstance(prs[0], dict) and isinstance(prs[0].get("number"), int):
            return prs[0]["number"]
    if event_name == "issue_comment":
        issue = payload.get("issue")
        if isinstance(issue, dict) and issue.get("pull_request") and isinstance(issue.get("number"), int):
            return issue["number"]
    if not event_name:  # unknown event name: take a pull_request payload when there is one
        pr = payload.get("pull_request")
        if isinstance(pr, dict) and isinstance(pr.get("number"), int):
            return pr["number"]
    return None


def verify_workflow_run_pr(client: Any, pr: PullRequest) -> None:
    """For a number read from an artifact under ``workflow_run``: the PR's head must be the run's head.

    The artifact was produced by the PR's own (untrusted) workflow run; without this check a PR could
    name another PR's number and have the privileged job comment there.
    """
    if pr.event_name != "workflow_run" or pr.source != "file" or not pr.head_sha:
        return
    data = client.get_json(f"repos/{pr.repo}/pulls/{pr.number}")
    head = (data.get("head") or {}) if isinstance(data, dict) else {}
    if head.get("sha") == pr.head_sha:
        return
    # A push after the run moves the PR's head; the PR's branch (repository + ref) still identifies it.
    repo = (head.get("repo") or {}).get("full_name")
    if pr.head_repo and pr.head_branch and repo == pr.head_repo and head.get("ref") == pr.head_branch:
        return
    raise ConfigError(
        f"PR #{pr.number} (from the artifact's {PR_NUMBER_FILE} file) is {repo}:{head.get('ref')} at "
        f"{str(head.get('sha'))[:12]}, but the workflow run that produced the artifact ran on "
        f"{pr.head_repo}:{pr.head_branch} at {pr.head_sha[:12]}: refusing to comment"
    )
