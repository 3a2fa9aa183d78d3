"""Credentials never leave the process: user info in URLs is masked wherever it is shown.

A source URL may carry a password (`redis://:secret@host`, `http://user:pw@host`);
`/ready`, logs and error messages show such URLs with the user info replaced.
"""

from __future__ import annotations

import re

__all__ = ["redact"]

# scheme://user[:password]@  ->  scheme://***@
_USER_INFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def redact(text: str) -> str:
    """`text` with the user info of every URL in it replaced by `***`."""
    return _USER_INFO.sub(r"\g<scheme>***@", text)
