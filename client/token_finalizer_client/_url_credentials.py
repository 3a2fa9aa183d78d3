"""User info in a URL: sent as Basic auth, never shown (client/README.md#proxies-and-credentials).

`http://svc:PW@store:8100` is a store reached with Basic auth `svc:PW`. The
password must not reach a repr, an error message or a log line, so wherever
the client shows a URL the user info is `***` (as the service shows its
sources' URLs); and it goes on the wire as an `Authorization: Basic` header
of a URL without it, so no client library reads (or combines) it on its own.
A bearer `token` given too wins: a request carries one Authorization header,
and the store's auth is the bearer token.
"""

from __future__ import annotations

import base64
import re
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = ["masked", "sent_as_auth", "without_user_info"]

# scheme://user[:password]@  ->  scheme://***@
_USER_INFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s]+@")


def masked(text: str) -> str:
    """`text` with the user info of every URL in it replaced by `***`."""
    return _USER_INFO.sub(r"\g<scheme>***@", text)


def without_user_info(url: str) -> tuple[str, str | None]:
    """`url` without its user info, and the Basic `Authorization` value it held (or None)."""
    parts = urlsplit(url)
    user_info, at, host = parts.netloc.rpartition("@")
    if not at:
        return url, None
    user, _, password = user_info.partition(":")
    pair = f"{unquote(user)}:{unquote(password)}".encode()
    bare = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return bare, f"Basic {base64.b64encode(pair).decode('ascii')}"


def sent_as_auth(url: str, headers: dict[str, str]) -> str:
    """`url` without its user info, which goes into `headers` unless they hold a bearer token."""
    bare, basic = without_user_info(url)
    if basic is not None and "Authorization" not in headers:
        headers["Authorization"] = basic
    return bare
