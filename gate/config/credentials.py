"""Refusing credentials in pip specs and arguments, which gate stores where anyone can read them."""

from __future__ import annotations

import re

from gate.errors import ConfigError

# user:password@ or token@ in front of a URL's host. Scheme, then the user information up to the
# first "@" before any path, query or fragment.
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<userinfo>[^/?#@\s]+)@")


def check_no_credentials(value: str, where: str, key: str) -> None:
    """Refuse a pip spec or argument whose URL carries credentials.

    Specs and pip arguments are not secrets to gate: they are written into the gate image's labels
    and build history, each venv's gate-venv.json, install logs and reports. A user name alone over
    ssh (``git+ssh://git@host/...``) is not a credential: the key authenticates.
    """
    for match in _URL_USERINFO.finditer(value):
        if match["scheme"].lower().endswith("ssh") and ":" not in match["userinfo"]:
            continue
        shown = value[: match.start("userinfo")] + "***" + value[match.end("userinfo") :]
        raise ConfigError(
            f"{where}: {key}: {shown!r} carries credentials in its URL, which would be stored in the image labels "
            "and gate-venv.json; keep the URL bare here and put the credentials in ~/.netrc, which pip and uv read "
            "at install time"
        )
