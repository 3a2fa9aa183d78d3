"""Credentials never leave the process: user info in URLs is masked wherever it is shown.

A source URL may carry a password (`redis://:secret@host`, `http://user:pw@host`);
`/ready`, logs and error messages show such URLs with the user info replaced.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

__all__ = ["redact", "redacted_url"]

# scheme://user[:password]@  ->  scheme://***@
_USER_INFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def redact(text: str) -> str:
    """`text` with the user info of every URL in it replaced by `***`."""
    return _USER_INFO.sub(r"\g<scheme>***@", text)


def redacted_url(url: str) -> str:
    """`url` without credentials or query (where redis-py, for one, reads a password too)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "(an unparsable redis url)"
    if ":" in host:
        host = f"[{host}]"
    where = f"{host}:{port}" if port is not None else host
    return f"{parts.scheme}://{where}{parts.path}"
