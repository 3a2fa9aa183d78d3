"""Run an ASGI app and say, exactly once, when its answer is complete and with what status.

The access log and the store's metrics both act at that moment: before the last
body byte leaves, so whoever saw the answer can already see its log line and its
count in /metrics; and after the app raised or never finished its answer, with
the status it got so far (500 when it sent none).
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["call_until_answered"]


async def call_until_answered(
    app: ASGIApp, scope: Scope, receive: Receive, send: Send, answered: Callable[[int], None]
) -> None:
    """`await app(scope, receive, send)`, calling `answered(status)` once, as described above."""
    status = 500
    done = False

    def finish() -> None:
        nonlocal done
        if not done:
            done = True
            answered(status)

    async def send_and_note(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body" and not message.get("more_body"):
            finish()
        await send(message)

    try:
        await app(scope, receive, send_and_note)
    finally:
        finish()
