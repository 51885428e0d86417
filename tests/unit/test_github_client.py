"""The GitHub client against the protocol fake (tests/github_server.py): auth, retries, pagination, errors."""

from __future__ import annotations

import socket

import httpx
import pytest

from gate.github.client import GitHubClient, GitHubError, TransientServerError, token_from_env
from tests.github_server import FakeGitHub, Token

SECRET = "ghs_SeCrEt0123456789abcdef"  # distinctive, so a leak is found by a substring search
REPO = "acme/rl"


@pytest.fixture
def gh():
    with FakeGitHub({SECRET: Token("gate-bot"), "read-only": Token(None, write=False)}) as server:
        server.add_pull(REPO, 5)
        yield server


def client(gh: FakeGitHub, token: str = SECRET, sleeps: list | None = None, **kw) -> GitHubClient:
    sleeps = sleeps if sleeps is not None else []
    return GitHubClient(token, gh.url, sleep=sleeps.append, **kw)


def test_auth_header_and_api_url_from_environment(gh, monkeypatch):
    monkeypatch.setenv("GITHUB_API_URL", gh.url + "/")
    with GitHubClient(SECRET) as c:
        assert c.get_json("user")["login"] == "gate-bot"
    assert gh.requests[-1].authorized and gh.requests[-1].path == "/user"


def test_default_api_url_is_github_com(monkeypatch):
    monkeypatch.delenv("GITHUB_API_URL", raising=False)
    assert GitHubClient("t").api_url == "https://api.github.com"


def test_wrong_token_is_a_one_line_401_without_the_token(gh):
    with pytest.raises(GitHubError) as err, client(gh, token="ghp_WrongToken42") as c:
        c.get_json("user")
    msg = str(err.value)
    assert (
        err.value.status == 401
        and "Bad credentials" in msg
        and "token is missing, wrong or expired" in msg
    )
    assert "ghp_WrongToken42" not in msg and "\n" not in msg
    assert len(gh.requests) == 1  # a 401 is not retried


def test_missing_token_is_refused_before_any_request(gh):
    with pytest.raises(GitHubError, match="no GitHub token"):
        GitHubClient("", gh.url)
    assert gh.requests == []


def test_token_from_env_prefers_github_token():
    assert token_from_env({"GITHUB_TOKEN": "a", "GH_TOKEN": "b"}) == "a"
    assert token_from_env({"GH_TOKEN": "b"}) == "b"
    assert token_from_env({}) == ""


def test_pagination_follows_link_headers(gh):
    for i in range(250):
        gh.add_comment(REPO, 5, f"comment {i}", "someone")
    with client(gh) as c:
        bodies = [
            item["body"] for item in c.paginate(f"repos/{REPO}/issues/5/comments", per_page=100)
        ]
    assert bodies == [f"comment {i}" for i in range(250)]
    gets = gh.calls("GET")
    assert len(gets) == 3
    assert gets[0].query == {"per_page": "100"}
    # later pages are GitHub's absolute next links (/repositories/<id>/...), followed as given
    assert gets[1].path.startswith("/repositories/") and gets[1].query == {
        "per_page": "100",
        "page": "2",
    }
    assert gets[2].query["page"] == "3"


def test_pagination_single_page_has_no_link(gh):
    gh.add_comment(REPO, 5, "only", "someone")
    with client(gh) as c:
        assert [i["body"] for i in c.paginate(f"repos/{REPO}/issues/5/comments")] == ["only"]
    assert len(gh.calls("GET")) == 1


def test_pagination_refuses_a_next_link_on_another_origin():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json=[{"id": 1}], headers={"Link": '<https://evil.example/x?page=2>; rel="next"'}
        )

    c = GitHubClient(SECRET, "https://api.github.com", transport=httpx.MockTransport(handler))
    with pytest.raises(GitHubError, match="refusing to send the token"):
        list(c.paginate("repos/a/b/issues/1/comments"))


def test_502s_are_retried_with_exponential_backoff(gh):
    gh.inject("GET", "^/user$", 502, times=3, message="Bad Gateway")
    sleeps: list[float] = []
    with client(gh, sleeps=sleeps, backoff=1.0) as c:
        assert c.get_json("user")["login"] == "gate-bot"
    assert [r.status for r in gh.calls("GET", "^/user$")] == [502, 502, 502, 200]
    assert len(sleeps) == 3
    for attempt, delay in enumerate(sleeps):  # 1, 2, 4 seconds with up to 50% jitter below
        assert 0.5 * 2**attempt <= delay <= 2**attempt


def test_5xx_gives_up_after_max_retries_with_a_clear_message(gh):
    gh.inject("GET", "^/user$", 503, times=99, message="Service Unavailable")
    sleeps: list[float] = []
    with pytest.raises(GitHubError) as err, client(gh, sleeps=sleeps, max_retries=2) as c:
        c.get_json("user")
    assert err.value.status == 503 and "gave up after 3 attempt(s)" in str(err.value)
    assert len(gh.calls("GET")) == 3 and len(sleeps) == 2


def test_backoff_is_capped(gh):
    c = client(gh, backoff=1.0, max_backoff=5.0)
    assert all(c.backoff_delay(a) <= 5.0 for a in range(20))


def test_post_is_not_retried_on_5xx(gh):
    gh.inject("POST", "/comments$", 502, times=1)
    with pytest.raises(TransientServerError) as err, client(gh) as c:
        c.request("POST", f"repos/{REPO}/issues/5/comments", json_body={"body": "x"})
    assert err.value.status == 502
    assert len(gh.calls("POST")) == 1


def test_secondary_rate_limit_403_with_retry_after_is_waited_out(gh):
    gh.inject("POST", "/comments$", 403, headers={"retry-after": "7"},
              message="You have exceeded a secondary rate limit. Please wait a few minutes before you try again.")  # fmt: skip
    sleeps: list[float] = []
    with client(gh, sleeps=sleeps) as c:
        r = c.request("POST", f"repos/{REPO}/issues/5/comments", json_body={"body": "hello"})
    assert r.status_code == 201 and sleeps == [7.0]
    assert [x.status for x in gh.calls("POST")] == [403, 201]
    assert (
        len(gh.comments(REPO, 5)) == 1
    )  # a rate-limited request was not processed: retrying is safe


def test_429_and_ratelimit_remaining_zero_are_retried(gh):
    gh.inject("GET", "^/user$", 429, headers={"retry-after": "2"})
    gh.inject(
        "GET", "^/user$", 403, headers={"x-ratelimit-remaining": "0", "x-ratelimit-reset": "0"}
    )
    sleeps: list[float] = []
    with client(gh, sleeps=sleeps) as c:
        assert c.get_json("user")["login"] == "gate-bot"
    assert sleeps[0] == 2.0 and sleeps[1] == 1.0  # a reset in the past waits the minimum


def test_secondary_rate_limit_message_without_headers_waits_a_minute(gh):
    gh.inject("GET", "^/user$", 403, message="You have exceeded a secondary rate limit")
    sleeps: list[float] = []
    with client(gh, sleeps=sleeps) as c:
        c.get_json("user")
    assert sleeps == [60.0]


def test_rate_limits_that_never_lift_give_up_with_a_rate_limit_message(gh):
    gh.inject("GET", "^/user$", 429, times=99, headers={"retry-after": "1"})
    sleeps: list[float] = []
    with (
        pytest.raises(GitHubError, match=r"429 rate limited; gave up after 3 attempt"),
        client(gh, sleeps=sleeps, max_retries=2) as c,
    ):
        c.get_json("user")
    assert sleeps == [1.0, 1.0]


def test_a_rate_limit_longer_than_max_wait_is_an_error_not_a_sleep(gh):
    gh.inject(
        "GET", "^/user$", 403, headers={"retry-after": "3600"}, message="secondary rate limit"
    )
    sleeps: list[float] = []
    with (
        pytest.raises(GitHubError, match=r"rate limited; retry in 3600s"),
        client(gh, sleeps=sleeps) as c,
    ):
        c.get_json("user")
    assert sleeps == []


def test_403_on_write_explains_the_fork_split(gh):
    with pytest.raises(GitHubError) as err, client(gh, token="read-only") as c:
        c.request("POST", f"repos/{REPO}/issues/5/comments", json_body={"body": "x"})
    msg = str(err.value)
    assert err.value.status == 403 and "Resource not accessible by integration" in msg
    assert (
        "fork" in msg
        and "workflow_run" in msg
        and "pull-requests: write" in msg
        and "\n" not in msg
    )


def test_404_names_what_to_check(gh):
    with pytest.raises(GitHubError) as err, client(gh) as c:
        c.get_json(f"repos/{REPO}/issues/999/comments")
    assert err.value.status == 404 and "GITHUB_REPOSITORY" in str(err.value)
    assert f"/repos/{REPO}/issues/999/comments" in str(err.value)


def test_422_on_an_oversized_body_says_so(gh):
    body = "x" * 65_537
    with pytest.raises(GitHubError) as err, client(gh) as c:
        c.request("POST", f"repos/{REPO}/issues/5/comments", json_body={"body": body})
    assert err.value.status == 422
    assert "65,537 characters; GitHub's limit is 65,536" in str(err.value)
    with client(gh) as c:  # exactly at the limit is accepted
        assert (
            c.request(
                "POST", f"repos/{REPO}/issues/5/comments", json_body={"body": "x" * 65_536}
            ).status_code
            == 201
        )


def test_connection_refused_is_retried_then_one_line(gh):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    sleeps: list[float] = []
    c = GitHubClient(SECRET, f"http://127.0.0.1:{port}", sleep=sleeps.append, max_retries=2)
    with pytest.raises(GitHubError) as err:
        c.get_json("user")
    assert "no answer from" in str(err.value) and SECRET not in str(err.value) and len(sleeps) == 2


def test_the_token_never_appears_in_any_error(gh):
    cases = [
        ("GET", "user", 502),
        ("GET", "user", 404),
        ("POST", f"repos/{REPO}/issues/5/comments", 500),
    ]
    for method, path, status in cases:
        gh.inject(
            method, ".*", status, times=99, message=f"echo {SECRET}"
        )  # even if the server echoed it
        with pytest.raises(GitHubError) as err, client(gh, max_retries=0) as c:
            c.request(method, path, json_body={"body": SECRET} if method == "POST" else None)
        assert SECRET not in str(err.value) and SECRET not in repr(err.value.args)
        gh.injections.clear()


def test_bad_api_url_is_refused():
    with pytest.raises(GitHubError, match="not an http"):
        GitHubClient("t", "ftp://example")
