"""`Reply`: one HTTP answer as the client's exchange hands it on, read whole.

Its own module so that `_wire` (which reads replies) and `_exchange` (which
makes them) need not import each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Reply"]


@dataclass(frozen=True, slots=True)
class Reply:
    """One HTTP answer, read whole: its status, headers and decoded body.

    `content` of an error answer is empty when its body was too large or did
    not decode (its status still says what happened). `request` names the
    call in messages: method and URL, never headers.
    """

    status_code: int
    headers: Mapping[str, str]
    content: bytes
    request: str

    @property
    def is_success(self) -> bool:
        """Whether the status is 2xx."""
        return 200 <= self.status_code < 300

    @property
    def text(self) -> str:
        """The body as text (UTF-8; undecodable bytes replaced)."""
        return self.content.decode("utf-8", "replace")
