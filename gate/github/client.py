"""A small GitHub REST client: token auth, retries with backoff, ``Link`` pagination, one-line errors.

Only what ``gate comment`` needs. It talks to ``$GITHUB_API_URL`` (default https://api.github.com),
so GitHub Enterprise Server works too. The token is sent in the ``Authorization`` header only and is
redacted from every message this module produces: it never reaches logs, exceptions or reports.

Retries (https://docs.github.com/en/rest/using-the-rest-api/best-practices-for-using-the-rest-api):
- 5xx and transport errors: exponential backoff (``backoff * 2**attempt``, capped), for idempotent
  methods; a non-idempotent request (POST) is retried only when the caller says it is safe, because a
  502 does not tell whether the comment was created (``gate.github.comment`` looks again instead).
- secondary rate limits (403/429 with ``retry-after``, or ``x-ratelimit-remaining: 0``, or a 403 whose
  message says so): wait ``retry-after`` seconds, or until ``x-ratelimit-reset``, or at least a minute,
  then retry; these requests were not processed, so every method may be retried. A wait longer than
  ``max_wait`` is not slept through: the error says when to try again.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from gate import __version__
from gate.errors import EXIT_USAGE, GateError
from gate.render.budget import COMMENT_BODY_LIMIT

DEFAULT_API_URL = "https://api.github.com"
API_VERSION = "2022-11-28"
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS"})
_RETRY_STATUS = frozenset({500, 502, 503, 504})


class GitHubError(GateError):
    """A GitHub API call failed; the message is one line and never contains the token."""

    def __init__(
        self, message: str, status: int | None = None, method: str = "", path: str = ""
    ) -> None:
        super().__init__(message)
        self.status = status
        self.method = method
        self.path = path


class GitHubConfigError(GitHubError):
    """No token, or an API URL that is not one: the workflow's configuration, not GitHub, is wrong."""

    exit_code = EXIT_USAGE


class TransientServerError(GitHubError):
    """A 5xx or transport error on a request that was not retried because it is not idempotent."""


class GitHubClient:
    """``GitHubClient(token)``; use as a context manager or call :meth:`close`."""

    def __init__(
        self,
        token: str,
        api_url: str | None = None,
        *,
        max_retries: int = 5,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        max_wait: float = 300.0,
        timeout: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not token:
            raise GitHubConfigError(
                "no GitHub token: set GITHUB_TOKEN (in a workflow: `github-token: ${{ github.token }}`, "
                "the action's default)",
                status=None,
            )
        self.api_url = (api_url or os.environ.get("GITHUB_API_URL") or DEFAULT_API_URL).rstrip("/")
        parts = urlsplit(self.api_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise GitHubConfigError(f"GITHUB_API_URL '{self.api_url}' is not an http(s) URL")
        self._origin = f"{parts.scheme}://{parts.netloc}"
        self._token = token
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_wait = max_wait
        self._sleep = sleep
        self._http = httpx.Client(
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": API_VERSION,
                "User-Agent": f"vllm-upgrade-gate/{__version__}",
            },
            timeout=timeout,
            follow_redirects=True,  # httpx drops Authorization on a redirect to another origin
            transport=transport,
        )

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GitHubClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests --------------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json_body: Any = None,
        retry_unsafe: bool | None = None,
    ) -> httpx.Response:
        """One API call with retries; ``path`` is relative to the API URL or an absolute URL on it.

        Returns the successful (2xx/3xx) response; raises :class:`GitHubError` otherwise.
        ``retry_unsafe`` overrides whether 5xx/transport errors are retried (default: idempotent methods).
        """
        method = method.upper()
        url = self._url(path)
        shown = self._shown(url)
        retry_5xx = method in _IDEMPOTENT if retry_unsafe is None else retry_unsafe
        attempt = 0
        while True:
            try:
                response = self._http.request(method, url, params=params, json=json_body)
            except httpx.TransportError as exc:
                reason = self.redact(f"{type(exc).__name__}: {exc}") or type(exc).__name__
                if not retry_5xx or attempt >= self.max_retries:
                    cls = TransientServerError if not retry_5xx else GitHubError
                    raise cls(
                        f"GitHub API: {method} {shown}: no answer from {self._origin} ({reason})",
                        None,
                        method,
                        shown,
                    ) from None
                self._sleep(self.backoff_delay(attempt))
                attempt += 1
                continue
            status = response.status_code
            if status < 400:
                return response
            wait = self._rate_limit_wait(response)
            if wait is not None:
                if wait > self.max_wait or attempt >= self.max_retries:
                    why = (
                        f"retry in {wait:.0f}s (more than the {self.max_wait:.0f}s this client waits)"
                        if wait > self.max_wait
                        else f"gave up after {attempt + 1} attempt(s)"
                    )
                    raise GitHubError(
                        f"GitHub API: {method} {shown}: {status} rate limited; {why}",
                        status,
                        method,
                        shown,
                    )
                self._sleep(wait)
                attempt += 1
                continue
            if status in _RETRY_STATUS:
                if retry_5xx and attempt < self.max_retries:
                    self._sleep(self.backoff_delay(attempt))
                    attempt += 1
                    continue
                cls = TransientServerError if not retry_5xx else GitHubError
                raise cls(
                    self._message(method, shown, response, json_body, attempt),
                    status,
                    method,
                    shown,
                )
            raise GitHubError(
                self._message(method, shown, response, json_body, attempt), status, method, shown
            )

    def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return self._json(self.request("GET", path, params=params), "GET", path)

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``data`` of a GraphQL query; GitHubError when GitHub answers with ``errors`` instead."""
        body = {"query": query, **({"variables": variables} if variables else {})}
        # A query has no side effect, so a 5xx may be retried like a GET.
        answer = self._json(
            self.request("POST", self.graphql_url, json_body=body, retry_unsafe=True),
            "POST",
            self.graphql_url,
        )
        errors = answer.get("errors") if isinstance(answer, dict) else None
        if errors or not isinstance(answer, dict) or not isinstance(answer.get("data"), dict):
            first = (
                errors[0].get("message")
                if isinstance(errors, list) and errors and isinstance(errors[0], dict)
                else None
            )
            raise GitHubError(
                self.redact(
                    f"GitHub API: POST /graphql: {first or 'no data in the answer'}"
                ).replace("\n", " "),
                None,
                "POST",
                "/graphql",
            )
        return answer["data"]

    @property
    def graphql_url(self) -> str:
        """api.github.com/graphql; on GitHub Enterprise Server <host>/api/graphql beside <host>/api/v3."""
        if self.api_url.endswith("/api/v3"):
            return self.api_url[: -len("/v3")] + "/graphql"
        return self.api_url + "/graphql"

    def paginate(
        self, path: str, params: dict[str, Any] | None = None, per_page: int = 100
    ) -> Iterator[Any]:
        """Yield the items of a list endpoint, following ``Link: <...>; rel="next"`` headers."""
        url: str | None = path
        query: dict[str, Any] | None = {**(params or {}), "per_page": per_page}
        while url:
            response = self.request("GET", url, params=query)
            items = self._json(response, "GET", url)
            if not isinstance(items, list):
                raise GitHubError(
                    f"GitHub API: GET {self._shown(self._url(url))}: expected a list, got {type(items).__name__}"
                )
            yield from items
            nxt = response.links.get("next", {}).get("url")
            url, query = nxt, None  # the next link carries the whole query
            if url and not self._url(url).startswith(self._origin + "/"):
                raise GitHubError(
                    f"GitHub API: pagination link leaves {self._origin}; refusing to send the token there"
                )

    # -- helpers ---------------------------------------------------------------------------------
    def redact(self, text: str) -> str:
        # Real tokens are 40+ characters; a toy one of a few letters would mangle every message.
        return text.replace(self._token, "***") if len(self._token) >= 6 else text

    def _url(self, path: str) -> str:
        if path.startswith(("http://", "https://")):
            if not path.startswith(self._origin + "/"):
                raise GitHubError(
                    f"GitHub API: refusing to send the token to {urlsplit(path).netloc} (not {self._origin})"
                )
            return path
        return f"{self.api_url}/{path.lstrip('/')}"

    def _shown(self, url: str) -> str:
        """The URL as messages show it: the path below the API URL, no query string."""
        path = urlsplit(url).path
        base = urlsplit(self.api_url).path
        if base and path.startswith(base):
            path = path[len(base) :] or "/"
        return self.redact(path)

    def _json(self, response: httpx.Response, method: str, path: str) -> Any:
        try:
            return response.json()
        except ValueError:
            raise GitHubError(
                f"GitHub API: {method} {self._shown(self._url(path))}: response is not JSON"
            ) from None

    def backoff_delay(self, attempt: int) -> float:
        delay = min(self.max_backoff, self.backoff * (2**attempt))
        return delay * (0.5 + random.random() / 2)  # jitter: many jobs do not retry in lockstep

    def _rate_limit_wait(self, response: httpx.Response) -> float | None:
        """Seconds to wait for a (secondary) rate limit, or None when the response is not one."""
        if response.status_code not in (403, 429):
            return None
        headers = response.headers
        retry_after = headers.get("retry-after")
        if retry_after is not None:
            try:
                return max(0.0, float(retry_after))
            except ValueError:
                return 60.0
        if headers.get("x-ratelimit-remaining") == "0":
            reset = headers.get("x-ratelimit-reset")
            try:
                return max(1.0, float(reset) - time.time())
            except (TypeError, ValueError):
                return 60.0
        if (
            response.status_code == 429
            or "secondary rate limit" in _github_message(response).lower()
        ):
            return 60.0
        return None

    def _message(
        self, method: str, shown: str, response: httpx.Response, json_body: Any, attempt: int
    ) -> str:
        status = response.status_code
        message = _github_message(response)
        head = f"GitHub API: {method} {shown}: {status}" + (f" {message}" if message else "")
        if status == 401:
            hint = (
                "the token is missing, wrong or expired; pass a valid token (`github-token` input, "
                "or GITHUB_TOKEN in the environment)"
            )
        elif status == 403:
            hint = (
                "the token may not write to this repository's pull requests. On a pull request from a fork "
                "GITHUB_TOKEN is read-only: run the gate on `pull_request`, upload report.json and the PR "
                "number as an artifact, and comment from a `workflow_run` workflow "
                "(examples/workflows/gate-fork-pr.yml + gate-fork-comment.yml); otherwise grant "
                "`permissions: pull-requests: write`"
            )
        elif status == 404:
            hint = (
                "not found: check GITHUB_REPOSITORY, the PR number and GITHUB_API_URL; a token that cannot "
                "see a private repository also gets 404"
            )
        elif status == 422:
            body = json_body.get("body") if isinstance(json_body, dict) else None
            if isinstance(body, str) and len(body) > COMMENT_BODY_LIMIT:
                hint = f"the body has {len(body):,} characters; GitHub's limit is {COMMENT_BODY_LIMIT:,}"
            else:
                hint = "GitHub rejected the request's content" + _github_errors(response)
        elif status in _RETRY_STATUS:
            hint = f"GitHub is failing (gave up after {attempt + 1} attempt(s)); re-run the job"
        else:
            hint = ""
        return self.redact(f"{head}: {hint}" if hint else head).replace("\n", " ")


def _github_message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return ""
    message = data.get("message") if isinstance(data, dict) else None
    return str(message) if message else ""


def _github_errors(response: httpx.Response) -> str:
    try:
        errors = response.json().get("errors")
    except (ValueError, AttributeError):
        return ""
    return f" ({json.dumps(errors)[:300]})" if errors else ""


def token_from_env(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("GITHUB_TOKEN") or env.get("GH_TOKEN") or ""
