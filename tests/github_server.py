"""A small GitHub REST API on 127.0.0.1 for tests: a protocol fake of GitHub, not a mock of our code.

Our real client talks HTTP to it. It behaves like api.github.com for the calls the gate makes:

- auth required: no or a wrong ``Authorization`` header is 401 ``Bad credentials``;
- ``GET /user``: the login of a user token; 403 ``Resource not accessible by integration`` for an
  installation token (the Actions ``GITHUB_TOKEN``, whose comments are ``github-actions[bot]``'s, or a
  GitHub App's, whose comments are ``<app-slug>[bot]``'s and carry ``performed_via_github_app``);
- ``POST /graphql`` with ``query { viewer { login } }``: the token's login, ``<app-slug>[bot]`` for an
  installation token (other queries get GraphQL's 200 with ``errors``);
- ``GET /repos/{o}/{r}/issues/{n}/comments`` with ``per_page`` (default 30, max 100) and ``page``,
  oldest first, and a ``Link`` header (``next``, ``last``, ``first``, ``prev``) whose URLs point at
  ``/repositories/{id}/...`` as GitHub's do;
- ``POST`` a comment (201) and ``PATCH /repos/{o}/{r}/issues/comments/{id}`` (200); 422 ``Validation
  Failed`` when the body is over 65,536 characters; 403 for a read-only token (a fork PR's);
  ``DELETE /repos/{o}/{r}/issues/comments/{id}`` (204);
- ``GET /repos/{o}/{r}/pulls/{n}``, and ``GET /repos/{o}/{r}/pulls?head=owner:branch&state=open``;
- hooks (:meth:`FakeGitHub.before`): run a function before a matching request is processed, e.g. a
  concurrent run's comment created just before ours;
- injected failures (:meth:`FakeGitHub.inject`): e.g. 502s, or a secondary-rate-limit 403 with
  ``retry-after``, optionally after the request was processed (a lost response);
- every request is recorded (method, path, query, status, JSON body), never the token.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

BODY_LIMIT = 65_536
ACTIONS_BOT = "github-actions[bot]"


@dataclass
class Token:
    login: str | None  # None: an installation token (GET /user fails; acts as <app>[bot])
    write: bool = True
    app: str = "github-actions"  # an installation token's app slug
    viewer: str | None = None  # what GraphQL's viewer.login answers, when not the REST login

    @property
    def acts_as(self) -> str:
        return self.login or f"{self.app}[bot]"


@dataclass
class Injection:
    method: str
    path: re.Pattern
    status: int
    times: int
    headers: dict[str, str]
    message: str
    after: bool  # process the request first, then answer with the error (the response is "lost")


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    status: int
    body: Any = None
    authorized: bool = False


@dataclass
class _State:
    repos: dict[str, int] = field(default_factory=dict)  # full_name -> id
    issues: set[tuple[str, int]] = field(default_factory=set)
    pulls: dict[tuple[str, int], dict] = field(default_factory=dict)
    apps: dict[int, str] = field(default_factory=dict)  # comment id -> app slug it was made through
    comments: dict[int, dict] = field(default_factory=dict)
    next_id: int = 1000


class FakeGitHub:
    """``with FakeGitHub() as gh: ... gh.url ...``; tokens maps token -> :class:`Token`."""

    def __init__(self, tokens: dict[str, Token] | None = None) -> None:
        self.tokens = (
            tokens
            if tokens is not None
            else {"user-token": Token("gate-bot"), "app-token": Token(None)}
        )
        self.state = _State()
        self.requests: list[Recorded] = []
        self.injections: list[Injection] = []
        self.hooks: list[tuple[str, re.Pattern, Any]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> FakeGitHub:
        handler = type("Handler", (_Handler,), {"gh": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), name="fake-github", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeGitHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server, "not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # -- fixtures --------------------------------------------------------------------------------
    def add_pull(self, repo: str, number: int, head_sha: str = "a" * 40, head_ref: str = "feature",
                 head_repo: str | None = None) -> None:  # fmt: skip
        with self._lock:
            self.state.repos.setdefault(repo, 100 + len(self.state.repos))
            self.state.issues.add((repo, number))
            self.state.pulls[(repo, number)] = {
                "number": number,
                "head": {
                    "sha": head_sha,
                    "ref": head_ref,
                    "repo": {"full_name": head_repo or repo},
                },
            }

    def add_comment(self, repo: str, number: int, body: str, login: str) -> dict:
        with self._lock:
            return self._create(repo, number, body, login)

    def comments(self, repo: str | None = None, number: int | None = None) -> list[dict]:
        with self._lock:
            return [dict(c) for c in sorted(self.state.comments.values(), key=lambda c: c["id"])
                    if (repo is None or c["_repo"] == repo) and (number is None or c["_issue"] == number)]  # fmt: skip

    def inject(self, method: str, path: str, status: int, times: int = 1, headers: dict[str, str] | None = None,
               message: str = "Server Error", after: bool = False) -> None:  # fmt: skip
        """The next ``times`` requests matching ``method`` and the ``path`` regex get ``status``."""
        with self._lock:
            self.injections.append(
                Injection(
                    method.upper(), re.compile(path), status, times, headers or {}, message, after
                )
            )

    def before(self, method: str, path: str, fn: Any) -> None:
        """Call ``fn(self)`` once, before the next request matching ``method`` and the ``path`` regex is processed."""
        with self._lock:
            self.hooks.append((method.upper(), re.compile(path), fn))

    def calls(self, method: str | None = None, path: str | None = None) -> list[Recorded]:
        return [r for r in self.requests
                if (method is None or r.method == method) and (path is None or re.search(path, r.path))]  # fmt: skip

    # -- internals -------------------------------------------------------------------------------
    def _create(
        self, repo: str, number: int, body: str, login: str, app: str | None = None
    ) -> dict:
        self.state.next_id += 1
        cid = self.state.next_id
        comment = {
            "id": cid,
            "node_id": f"IC_{cid}",
            "body": body,
            "user": {"login": login, "type": "Bot" if login.endswith("[bot]") else "User"},
            "html_url": f"https://github.com/{repo}/pull/{number}#issuecomment-{cid}",
            "url": f"{self.url}/repos/{repo}/issues/comments/{cid}",
            "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z",
            "performed_via_github_app": {"slug": app, "name": app} if app else None,
            "_repo": repo,
            "_issue": number,
        }
        self.state.comments[cid] = comment
        return comment

    def _take_hook(self, method: str, path: str) -> Any:
        with self._lock:
            for i, (m, pattern, fn) in enumerate(self.hooks):
                if m == method and pattern.search(path):
                    del self.hooks[i]
                    return fn
        return None

    def _take_injection(self, method: str, path: str) -> Injection | None:
        with self._lock:
            for inj in self.injections:
                if inj.times > 0 and inj.method == method and inj.path.search(path):
                    inj.times -= 1
                    return inj
        return None


def _public(comment: dict) -> dict:
    return {k: v for k, v in comment.items() if not k.startswith("_")}


class _Handler(BaseHTTPRequestHandler):
    gh: FakeGitHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # ------------------------------------------------------------------------------------------
    def _handle(self, method: str) -> None:
        split = urlsplit(self.path)
        path = split.path
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        record = Recorded(method, path, query, 0, body)
        self.gh.requests.append(record)

        auth = self.headers.get("Authorization") or ""
        scheme, _, token = auth.partition(" ")
        tok = self.gh.tokens.get(token) if scheme.lower() in ("bearer", "token") else None
        if tok is None:
            return self._send(
                record,
                401,
                {"message": "Bad credentials", "documentation_url": "https://docs.github.com/rest"},
            )
        record.authorized = True

        hook = self.gh._take_hook(method, path)
        if hook:
            hook(self.gh)
        inj = self.gh._take_injection(method, path)
        if inj and not inj.after:
            return self._send(record, inj.status, {"message": inj.message}, inj.headers)
        status, payload, headers = self._route(method, path, query, body, tok)
        if inj:  # processed, but the client never sees the answer
            return self._send(record, inj.status, {"message": inj.message}, inj.headers)
        self._send(record, status, payload, headers)

    def _route(
        self, method: str, path: str, query: dict, body: Any, tok: Token
    ) -> tuple[int, Any, dict]:
        gh = self.gh
        not_found = (
            404,
            {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"},
            {},
        )
        if path == "/user" and method == "GET":
            if tok.login is None:
                return 403, {"message": "Resource not accessible by integration"}, {}
            return 200, {"login": tok.login, "id": 1, "type": "User"}, {}
        login = tok.acts_as
        app = None if tok.login else tok.app
        if path == "/graphql" and method == "POST":
            query = body.get("query") if isinstance(body, dict) else None
            if isinstance(query, str) and re.fullmatch(
                r"\s*(query\s*)?\{\s*viewer\s*\{\s*login\s*\}\s*\}\s*", query
            ):
                return 200, {"data": {"viewer": {"login": tok.viewer or login}}}, {}
            return (
                200,
                {"errors": [{"message": "this fake answers only `query { viewer { login } }`"}]},
                {},
            )

        m = re.fullmatch(r"/repos/([^/]+/[^/]+)/issues/(\d+)/comments", path) or \
            re.fullmatch(r"/repositories/(\d+)/issues/(\d+)/comments", path)  # fmt: skip
        if m:
            repo = self._repo(m.group(1))
            number = int(m.group(2))
            if repo is None or (repo, number) not in gh.state.issues:
                return not_found
            if method == "GET":
                return self._list(repo, number, query)
            if method == "POST":
                if not tok.write:
                    return 403, {"message": "Resource not accessible by integration"}, {}
                text = body.get("body") if isinstance(body, dict) else None
                if not isinstance(text, str):
                    return 422, {"message": 'Invalid request.\n\n"body" wasn\'t supplied.'}, {}
                if len(text) > BODY_LIMIT:
                    return 422, _too_long(), {}
                with gh._lock:
                    comment = gh._create(repo, number, text, login, app)
                return 201, _public(comment), {"Location": comment["url"]}
            return 404, {"message": "Not Found"}, {}

        m = re.fullmatch(r"/repos/([^/]+/[^/]+)/issues/comments/(\d+)", path)
        if m:
            with gh._lock:
                comment = gh.state.comments.get(int(m.group(2)))
            if comment is None or comment["_repo"] != m.group(1):
                return not_found
            if method == "GET":
                return 200, _public(comment), {}
            if method == "PATCH":
                if not tok.write:
                    return 403, {"message": "Resource not accessible by integration"}, {}
                text = body.get("body") if isinstance(body, dict) else None
                if not isinstance(text, str):
                    return 422, {"message": "Invalid request."}, {}
                if len(text) > BODY_LIMIT:
                    return 422, _too_long(), {}
                with gh._lock:
                    comment["body"] = text
                    comment["updated_at"] = "2026-01-02T00:00:00Z"
                return 200, _public(comment), {}
            if method == "DELETE":
                if not tok.write:
                    return 403, {"message": "Resource not accessible by integration"}, {}
                with gh._lock:
                    gh.state.comments.pop(comment["id"], None)
                return 204, None, {}
            return not_found

        m = re.fullmatch(r"/repos/([^/]+/[^/]+)/pulls", path)
        if m and method == "GET":
            owner, _, ref = query.get("head", "").partition(":")
            state = query.get("state", "open")
            pulls = [p for (r, _), p in sorted(gh.state.pulls.items()) if r == m.group(1)
                     and (not owner or (p["head"]["repo"]["full_name"].split("/")[0] == owner and p["head"]["ref"] == ref))
                     and state in ("open", "all")]  # fmt: skip
            return 200, pulls, {}

        m = re.fullmatch(r"/repos/([^/]+/[^/]+)/pulls/(\d+)", path)
        if m and method == "GET":
            pull = gh.state.pulls.get((m.group(1), int(m.group(2))))
            return (200, pull, {}) if pull else not_found
        return not_found

    def _repo(self, key: str) -> str | None:
        if key.isdigit():
            return next(
                (name for name, rid in self.gh.state.repos.items() if rid == int(key)), None
            )
        return key if key in self.gh.state.repos else None

    def _list(self, repo: str, number: int, query: dict) -> tuple[int, Any, dict]:
        try:
            per_page = max(1, min(100, int(query.get("per_page", 30))))
            page = max(1, int(query.get("page", 1)))
        except ValueError:
            return 422, {"message": "Invalid request."}, {}
        items = [_public(c) for c in self.gh.comments(repo, number)]
        last = max(1, -(-len(items) // per_page))
        chunk = items[(page - 1) * per_page : page * per_page]
        rid = self.gh.state.repos[repo]
        base = f"{self.gh.url}/repositories/{rid}/issues/{number}/comments"
        links = []
        if page < last:
            links += [f'<{base}?per_page={per_page}&page={page + 1}>; rel="next"',
                      f'<{base}?per_page={per_page}&page={last}>; rel="last"']  # fmt: skip
        if page > 1:
            links += [f'<{base}?per_page={per_page}&page={page - 1}>; rel="prev"',
                      f'<{base}?per_page={per_page}&page=1>; rel="first"']  # fmt: skip
        return 200, chunk, ({"Link": ", ".join(links)} if links else {})

    def _send(
        self, record: Recorded, status: int, payload: Any, headers: dict[str, str] | None = None
    ) -> None:
        record.status = status
        data = b"" if status == 204 else json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-GitHub-Api-Version-Selected", "2022-11-28")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)


def _too_long() -> dict:
    return {
        "message": "Validation Failed",
        "errors": [
            {
                "resource": "IssueComment",
                "code": "custom",
                "field": "body",
                "message": "body is too long (maximum is 65536 characters)",
            }
        ],
        "documentation_url": "https://docs.github.com/rest/issues/comments#create-an-issue-comment",
    }
