"""One sticky PR comment per gate id, replaced in full on each run.

The comment is found by the hidden marker on its first line, ``<!-- gate-report:<gate_id> -->``, in the
paginated list of the PR's issue comments, among the comments written by the token's own login (so a
user who pastes the marker cannot capture the gate's comment). ``GET /user`` gives that login; the
Actions ``GITHUB_TOKEN`` is an app installation token for which ``/user`` fails, so the login then is
``github-actions[bot]``; ``--author`` overrides it (e.g. ``my-app[bot]`` for a GitHub App token).

Modes:
- ``always``: create the comment or update it;
- ``on-change``: update an existing comment when the body differs; create one only when the verdict
  is not PASS (a green PR stays quiet until there is something to say);
- ``on-failure``: create one only when the verdict is FAIL or ERROR, but always update an existing one
  (so a fixed PR's red comment turns green);
- ``off``: no API call at all.
An unchanged body is never sent again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gate.github.client import COMMENT_BODY_LIMIT, GitHubClient, GitHubError, TransientServerError
from gate.render.escape import marker_id

MODES = ("always", "on-change", "on-failure", "off")
ACTIONS_BOT = "github-actions[bot]"
_MARKER = "<!-- gate-report:{} -->"
_TRUNCATED = "\n\n*(truncated to fit GitHub's comment size limit; the full report is in the job's artifacts)*\n"


def marker(gate_id: str) -> str:
    """The renderer's marker line: the id reduced to characters that cannot end the HTML comment."""
    return _MARKER.format(marker_id(gate_id))


@dataclass(frozen=True)
class CommentResult:
    action: str  # created | updated | unchanged | skipped
    reason: str
    url: str | None = None
    id: int | None = None


def resolve_author(client: GitHubClient, override: str | None = None) -> str:
    """The login whose comments are ours: ``override``, else ``GET /user``, else github-actions[bot]."""
    if override:
        return override
    try:
        user = client.get_json("user")
    except GitHubError as exc:
        if exc.status in (403, 404):  # installation tokens (GITHUB_TOKEN) cannot read /user
            return ACTIONS_BOT
        raise
    login = user.get("login") if isinstance(user, dict) else None
    return login or ACTIONS_BOT


def is_ours(comment: dict[str, Any], gate_id: str, author: str) -> bool:
    body = comment.get("body") or ""
    first_line = body.lstrip("\ufeff").split("\n", 1)[0].strip()
    login = (comment.get("user") or {}).get("login")
    return first_line == marker(gate_id) and login == author


def find_comment(client: GitHubClient, repo: str, number: int, gate_id: str, author: str) -> dict[str, Any] | None:
    """The oldest comment of ``author`` whose first line is the gate's marker, or None."""
    for comment in client.paginate(f"repos/{repo}/issues/{number}/comments"):
        if isinstance(comment, dict) and is_ours(comment, gate_id, author):
            return comment
    return None


def decide(mode: str, verdict: str, existing: dict[str, Any] | None, body: str) -> tuple[str, str]:
    """What to do: ("create" | "update" | "unchanged" | "skip", reason). No API call."""
    if mode not in MODES:
        raise ValueError(f"comment mode '{mode}' is not one of {MODES}")
    if mode == "off":
        return "skip", "comment mode is off"
    if existing is not None and _same(existing.get("body") or "", body):
        return "unchanged", "the comment already has this body"
    failing = verdict in ("FAIL", "ERROR")
    if existing is not None:
        return "update", f"comment mode {mode}: the body changed"
    if mode == "always":
        return "create", "comment mode always"
    if mode == "on-change":
        if verdict != "PASS":
            return "create", f"comment mode on-change: verdict {verdict}"
        return "skip", "comment mode on-change: verdict PASS and no earlier comment"
    if failing:
        return "create", f"comment mode on-failure: verdict {verdict}"
    return "skip", f"comment mode on-failure: verdict {verdict} and no earlier comment"


def fit_body(body: str, limit: int = COMMENT_BODY_LIMIT) -> str:
    """A last resort when a rendered body is still over GitHub's limit: cut it and say so."""
    if len(body) <= limit:
        return body
    return body[: limit - len(_TRUNCATED)] + _TRUNCATED


def upsert_comment(
    client: GitHubClient,
    repo: str,
    number: int,
    body: str,
    gate_id: str,
    verdict: str,
    mode: str = "always",
    author: str | None = None,
    *,
    attempts: int = 3,
    sleep: Callable[[float], None] = time.sleep,
) -> CommentResult:
    """Create or update the gate's sticky comment on PR ``number`` according to ``mode``."""
    if mode == "off":
        return CommentResult("skipped", "comment mode is off")
    if not body.startswith(marker(gate_id)):
        body = f"{marker(gate_id)}\n{body}"
    body = fit_body(body)
    login = resolve_author(client, author)
    for attempt in range(attempts):
        existing = find_comment(client, repo, number, gate_id, login)
        action, reason = decide(mode, verdict, existing, body)
        if action == "skip":
            return CommentResult("skipped", reason)
        if action == "unchanged":
            return CommentResult("unchanged", reason, existing.get("html_url"), existing.get("id"))
        if action == "update":
            data = client.request("PATCH", f"repos/{repo}/issues/comments/{existing['id']}", json_body={"body": body}).json()
            return CommentResult("updated", reason, data.get("html_url"), data.get("id"))
        try:
            # POST is not idempotent: after a 5xx the comment may exist, so look again before retrying.
            response = client.request("POST", f"repos/{repo}/issues/{number}/comments", json_body={"body": body})
        except TransientServerError:
            if attempt + 1 >= attempts:
                raise
            sleep(client.backoff_delay(attempt))
            continue
        data = response.json()
        return CommentResult("created", reason, data.get("html_url"), data.get("id"))
    raise AssertionError("unreachable")


def _same(a: str, b: str) -> bool:
    return a.replace("\r\n", "\n").rstrip() == b.replace("\r\n", "\n").rstrip()
