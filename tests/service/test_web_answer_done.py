"""`call_until_answered`: the moment an answer is complete is said once, with its status."""

from __future__ import annotations

from typing import Any

import pytest

from token_finalizer.web.answer_done import call_until_answered

pytestmark = pytest.mark.anyio

SCOPE: dict[str, Any] = {"type": "http", "method": "GET", "path": "/x"}


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def test_a_streamed_answer_is_noted_once_before_its_last_part_leaves() -> None:
    """Several body parts: noted once, with the status, before the last part is sent."""
    events: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b", "more_body": False})

    async def send(message: dict[str, Any]) -> None:
        events.append(message.get("body", message["type"]))

    await call_until_answered(app, SCOPE, _receive, send, lambda status: events.append(status))
    assert events == ["http.response.start", b"a", 201, b"b"]


async def test_an_app_that_raises_before_answering_is_noted_as_500() -> None:
    """No answer sent and an exception: noted once as 500, and the exception goes on."""
    noted: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    async def send(message: dict[str, Any]) -> None:  # never called
        raise AssertionError(message)

    with pytest.raises(RuntimeError, match="boom"):
        await call_until_answered(app, SCOPE, _receive, send, noted.append)
    assert noted == [500]


async def test_an_answer_cut_off_after_its_start_keeps_its_status() -> None:
    """The status was sent, the body never finished: noted once with that status."""
    noted: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": []})

    async def send(message: dict[str, Any]) -> None:
        pass

    await call_until_answered(app, SCOPE, _receive, send, noted.append)
    assert noted == [503]
