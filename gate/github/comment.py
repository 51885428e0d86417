"""One sticky PR comment per gate id, replaced in full on each run.

The comment is found by the hidden marker on its first line, ``<!-- gate-report:<gate_id> -->``, in the
paginated list of the PR's issue comments, among the comments written by the token's own login (so a
user who pastes the marker cannot capture the gate's comment). ``GET /user`` gives that login for a
user token. An installation token (the Actions ``GITHUB_TOKEN``, a GitHub App's token) gets 403 there;
GraphQL's ``viewer`` still names it (``github-actions[bot]``, ``my-app[bot]``), and only when that fails
too is the login taken to be ``github-actions[bot]``. ``--author`` overrides all of this.

Two runs racing on one PR can both find no comment and both create one: after creating, the list is
read again and our duplicates are deleted, keeping the oldest (updated with this run's body).

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

from gate.github.client import GitHubClient, GitHubError, TransientServerError
from gate.render.budget import COMMENT_BODY_LIMIT, marker, utf16_len

_VIEWER = "query { viewer { login } }"

MODES = ("always", "on-change", "on-failure", "off")
ACTIONS_BOT = "github-actions[bot]"
_TRUNCATED = "\n\n*(truncated to fit GitHub's comment size limit; the full report is in the job's artifacts)*\n"


@dataclass(frozen=True)
class CommentResult:
    action: str  # created | updated | unchanged | skipped
    reason: str
    url: str | None = None
    id: int | None = None


def resolve_author(client: GitHubClient, override: str | None = None) -> str:
    """The login whose comments are ours: ``override``, else ``GET /user``, else the app's bot login."""
    if override:
        return override
    try:
        user = client.get_json("user")
    except GitHubError as exc:
        if exc.status in (403, 404):  # an installation token cannot read /user
            return _installation_login(client)
        raise
    login = user.get("login") if isinstance(user, dict) else None
    return login or ACTIONS_BOT


def _installation_login(client: GitHubClient) -> str:
    """The bot an installation token comments as, in the REST spelling (``<app-slug>[bot]``)."""
    try:
        viewer = client.graphql(_VIEWER).get("viewer")
    except GitHubError as exc:
        if exc.status == 401:  # a bad token is not an app token: say so instead of guessing
            raise
        return (
            ACTIONS_BOT  # GHES without GraphQL, or a token GraphQL refuses: the Actions token's bot
        )
    login = viewer.get("login") if isinstance(viewer, dict) else None
    if not isinstance(login, str) or not login:
        return ACTIONS_BOT
    # GraphQL may name a bot without the suffix that comment authors carry in REST answers.
    return login if login.endswith("[bot]") else f"{login}[bot]"


def is_ours(comment: dict[str, Any], gate_id: str, author: str) -> bool:
    body = comment.get("body") or ""
    first_line = body.lstrip("\ufeff").split("\n", 1)[0].strip()
    login = (comment.get("user") or {}).get("login")
    return first_line == marker(gate_id) and login == author


def find_comments(
    client: GitHubClient, repo: str, number: int, gate_id: str, author: str
) -> list[dict[str, Any]]:
    """Every comment of ``author`` whose first line is the gate's marker, oldest first."""
    ours = [
        c
        for c in client.paginate(f"repos/{repo}/issues/{number}/comments")
        if isinstance(c, dict) and is_ours(c, gate_id, author)
    ]
    return sorted(ours, key=_age)


def _age(comment: dict[str, Any]) -> tuple[str, int]:
    # Ids grow with time; created_at first, so the order does not hang on that alone.
    cid = comment.get("id")
    return str(comment.get("created_at") or ""), cid if isinstance(cid, int) else 0


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
    """A last resort when a rendered body is still over GitHub's limit: cut it and say so.

    Measured in UTF-16 units, the stricter count (an emoji is two), and never cut inside a character.
    """
    if utf16_len(body) <= limit:
        return body
    room = 2 * (limit - utf16_len(_TRUNCATED))
    return body.encode("utf-16-le")[:room].decode("utf-16-le", "ignore") + _TRUNCATED


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
        ours = find_comments(client, repo, number, gate_id, login)
        existing = ours[0] if ours else None
        action, reason = decide(mode, verdict, existing, body)
        if action == "skip":
            return CommentResult("skipped", reason)
        if existing is not None:  # decide() answers unchanged or update exactly when one exists
            kept = existing if action == "unchanged" else _patch(client, repo, existing["id"], body)
            _delete(client, repo, ours[1:])  # left behind by an earlier race
            return CommentResult(
                "unchanged" if action == "unchanged" else "updated",
                reason,
                kept.get("html_url"),
                kept.get("id"),
            )
        try:
            # POST is not idempotent: after a 5xx the comment may exist, so look again before retrying.
            response = client.request(
                "POST", f"repos/{repo}/issues/{number}/comments", json_body={"body": body}
            )
        except TransientServerError:
            if attempt + 1 >= attempts:
                raise
            sleep(client.backoff_delay(attempt))
            continue
        created = response.json()
        kept = _settle_race(client, repo, number, gate_id, login, body, created)
        return CommentResult("created", reason, kept.get("html_url"), kept.get("id"))
    raise AssertionError("unreachable")


def _settle_race(
    client: GitHubClient,
    repo: str,
    number: int,
    gate_id: str,
    login: str,
    body: str,
    created: dict[str, Any],
) -> dict[str, Any]:
    """After a create: if another run created one too, keep the oldest (with this body) and delete the rest.

    Both racers converge: each keeps the same oldest comment and deletes the others (a 404 on a comment
    the other run deleted first is fine), so the PR is left with one comment.
    """
    ours = find_comments(client, repo, number, gate_id, login)
    if len(ours) <= 1:
        return ours[0] if ours else created
    oldest = ours[0]
    if oldest.get("id") != created.get("id") and not _same(oldest.get("body") or "", body):
        oldest = _patch(client, repo, oldest["id"], body)
    _delete(client, repo, ours[1:])
    return oldest


def _patch(client: GitHubClient, repo: str, comment_id: int, body: str) -> dict[str, Any]:
    data = client.request(
        "PATCH", f"repos/{repo}/issues/comments/{comment_id}", json_body={"body": body}
    ).json()
    return data if isinstance(data, dict) else {"id": comment_id}


def _delete(client: GitHubClient, repo: str, comments: list[dict[str, Any]]) -> None:
    for comment in comments:
        try:
            client.request("DELETE", f"repos/{repo}/issues/comments/{comment['id']}")
        except GitHubError as exc:
            if exc.status != 404:  # already deleted by the run we raced with
                raise


def _same(a: str, b: str) -> bool:
    return a.replace("\r\n", "\n").rstrip() == b.replace("\r\n", "\n").rstrip()
