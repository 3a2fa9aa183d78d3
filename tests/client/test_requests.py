"""What the clients send and how they read odd answers (respx unit tests)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import pytest
import respx

from tests.client.answers import RETIRE, compact, plain_answer
from tests.client.conftest import Connect
from tests.support.captures import record_for
from token_finalizer_client import (
    BadRequestError,
    ConflictError,
    Finalized,
    FinalizerClient,
    FinalizerError,
    PermissionDeniedError,
)

BASE = "http://finalizer.test"
PLAIN = plain_answer(calls=3)
# What the service answers the client: it always asks for the compact form.
ANSWER = compact(PLAIN)
STALE = {"error": "the store no longer holds snapshot snap-1 version 3", "retired": False}


@pytest.fixture
def mock() -> Any:
    """respx routes for the fake service at BASE."""
    with respx.mock(base_url=BASE, assert_all_called=False) as router:
        yield router


def _finalize_request(mock: Any, client: Any, **finalize_options: Any) -> httpx.Request:
    route = mock.post("/finalize").mock(return_value=httpx.Response(200, json=ANSWER))
    client.finalize(record_for("r-1"), **finalize_options)
    return route.calls.last.request


def test_token_is_sent_as_bearer(connect: Connect, mock: Any) -> None:
    """With a token every request carries `Authorization: Bearer <token>`."""
    request = _finalize_request(mock, connect(BASE, token="s3cret"))
    assert request.headers["authorization"] == "Bearer s3cret"


def test_run_id_is_sent_as_x_run_id(connect: Connect, mock: Any) -> None:
    """run_id travels in the X-Run-Id header."""
    request = _finalize_request(mock, connect(BASE, run_id="run-7"))
    assert request.headers["x-run-id"] == "run-7"


def test_no_token_and_no_run_id_send_neither_header(connect: Connect, mock: Any) -> None:
    """Without token and run_id neither Authorization nor X-Run-Id is sent."""
    request = _finalize_request(mock, connect(BASE))
    assert "authorization" not in request.headers
    assert "x-run-id" not in request.headers


def test_zstd_answers_are_asked_for(connect: Connect, mock: Any) -> None:
    """Accept-Encoding names zstd, so large answers travel compressed."""
    request = _finalize_request(mock, connect(BASE))
    assert "zstd" in request.headers["accept-encoding"]


def test_record_is_sent_as_compact_json(connect: Connect, mock: Any) -> None:
    """The body is the record as JSON without spaces, typed application/json."""
    request = _finalize_request(mock, connect(BASE))
    assert request.headers["content-type"] == "application/json"
    assert request.content == json.dumps(record_for("r-1"), separators=(",", ":")).encode()


def test_arrays_in_a_record_are_sent_as_lists(connect: Connect, mock: Any) -> None:
    """An object with `tolist()` (a numpy array) is encoded as a JSON list."""
    route = mock.post("/finalize").mock(return_value=httpx.Response(200, json=ANSWER))
    connect(BASE).finalize(record_for("r-1", ids=np.arange(3)))
    assert json.loads(route.calls.last.request.content)["ids"] == [0, 1, 2]


def test_source_is_a_query_parameter(connect: Connect, mock: Any) -> None:
    """finalize(source=NAME) posts to /finalize?source=NAME."""
    request = _finalize_request(mock, connect(BASE), source="train-a")
    assert request.url.params["source"] == "train-a"


def test_finalize_asks_for_compact_tokens(connect: Connect, mock: Any) -> None:
    """Every finalize request carries the query parameter tokens=compact."""
    request = _finalize_request(mock, connect(BASE))
    assert request.url.params["tokens"] == "compact"


def test_compact_tokens_are_asked_for_with_a_source_too(connect: Connect, mock: Any) -> None:
    """finalize(source=NAME) sends both source=NAME and tokens=compact."""
    request = _finalize_request(mock, connect(BASE), source="train-a")
    assert dict(request.url.params) == {"source": "train-a", "tokens": "compact"}


def test_finalize_expands_the_compact_answer(connect: Connect, mock: Any) -> None:
    """finalize() returns the standard record, equal to the plain answer's."""
    mock.post("/finalize").mock(return_value=httpx.Response(200, json=ANSWER))
    finalized = connect(BASE).finalize(record_for("r-1"))
    assert finalized.to_answer() == PLAIN


def test_as_numpy_client_hands_out_arrays(connect: Connect, mock: Any) -> None:
    """A client made with as_numpy=True returns prompts as views of one array."""
    mock.post("/finalize").mock(return_value=httpx.Response(200, json=ANSWER))
    finalized = connect(BASE, as_numpy=True).finalize(record_for("r-1"))
    output = finalized.record["response"]["output"]
    views = [item["prompt_token_ids"] for item in output if "prompt_token_ids" in item]
    assert all(isinstance(view, np.ndarray) for view in views)
    assert len({id(view.base) for view in views}) == 1


def test_old_answer_without_retire_is_refused(connect: Connect, mock: Any) -> None:
    """A v1 answer (no `retire` key) raises a FinalizerError asking to upgrade the service."""
    old = {key: value for key, value in PLAIN.items() if key != "retire"}
    mock.post("/finalize").mock(return_value=httpx.Response(200, json=old))
    with pytest.raises(FinalizerError, match=r"old finalize answer \(no `retire` key\); upgrade"):
        connect(BASE).finalize(record_for("r-1"))


def test_retire_sends_exactly_the_retire_object(connect: Connect, mock: Any) -> None:
    """The retire body is the answer's `retire` object and nothing else."""
    route = mock.post("/retire").mock(return_value=httpx.Response(200, json={"retired": True}))
    assert connect(BASE).retire(Finalized.from_answer(ANSWER)) is True
    assert json.loads(route.calls.last.request.content) == RETIRE


def test_retire_of_a_stored_retire_object(connect: Connect, mock: Any) -> None:
    """retire(dict) posts a `retire` object read back from a JSON line as it is."""
    route = mock.post("/retire").mock(return_value=httpx.Response(200, json={"retired": True}))
    stored = json.loads(json.dumps(RETIRE))
    assert connect(BASE).retire(stored) is True
    assert json.loads(route.calls.last.request.content) == RETIRE


def test_retire_of_a_whole_stored_answer_sends_its_retire_object(
    connect: Connect, mock: Any
) -> None:
    """retire(answer) of a whole stored answer posts only the answer's `retire` object."""
    route = mock.post("/retire").mock(return_value=httpx.Response(200, json={"retired": True}))
    connect(BASE).retire(PLAIN)
    assert json.loads(route.calls.last.request.content) == RETIRE


def test_retire_without_a_ticket_makes_no_request(connect: Connect, mock: Any) -> None:
    """A Finalized whose `retire` is null answers False without calling the service."""
    route = mock.post("/retire").mock(return_value=httpx.Response(200, json={"retired": True}))
    masked = Finalized.from_answer({**PLAIN, "retirable": False, "retire": None})
    assert connect(BASE).retire(masked) is False
    assert route.call_count == 0


@pytest.mark.parametrize("target", [None, {**PLAIN, "retire": None}], ids=["none", "answer"])
def test_retire_of_nothing_makes_no_request(connect: Connect, mock: Any, target: Any) -> None:
    """retire(None), or of a stored answer whose `retire` is null, is False with no request."""
    route = mock.post("/retire").mock(return_value=httpx.Response(200, json={"retired": True}))
    assert connect(BASE).retire(target) is False
    assert route.call_count == 0


def test_retire_of_a_stale_snapshot_is_false(connect: Connect, mock: Any) -> None:
    """A 409 `{"retired": false}` (the store moved on) returns False, not an error."""
    mock.post("/retire").mock(return_value=httpx.Response(409, json=STALE))
    assert connect(BASE).retire(RETIRE) is False


def test_other_conflicts_of_retire_still_raise(connect: Connect, mock: Any) -> None:
    """A 409 without `"retired": false` raises ConflictError."""
    mock.post("/retire").mock(return_value=httpx.Response(409, json={"error": "busy"}))
    with pytest.raises(ConflictError, match="busy"):
        connect(BASE).retire(RETIRE)


def test_rejected_ticket_is_permission_denied(connect: Connect, mock: Any) -> None:
    """A 403 (the ticket does not verify) raises PermissionDeniedError."""
    error = {"error": "retire ticket does not verify"}
    mock.post("/retire").mock(return_value=httpx.Response(403, json=error))
    with pytest.raises(PermissionDeniedError, match="does not verify") as caught:
        connect(BASE).retire(RETIRE)
    assert caught.value.status_code == 403


def test_malformed_retire_object_is_bad_request(connect: Connect, mock: Any) -> None:
    """A 422 from /retire (missing or malformed fields) raises BadRequestError."""
    mock.post("/retire").mock(return_value=httpx.Response(422, json={"error": "needs `ticket`"}))
    with pytest.raises(BadRequestError, match="ticket"):
        connect(BASE).retire({"rollout_id": "r-1"})


def test_retire_of_something_else_is_a_type_error(connect: Connect) -> None:
    """retire() of neither a Finalized, a mapping nor None is refused before any request."""
    with pytest.raises(TypeError, match="Finalized"):
        connect(BASE).retire("r-1")


def test_retire_keyword_form_is_gone(connect: Connect) -> None:
    """The v1 form retire(rollout_id=, build=) is a TypeError."""
    with pytest.raises(TypeError, match="rollout_id"):
        connect(BASE).retire(rollout_id="r-1", build={})


def test_answer_that_is_not_a_finalize_answer_is_refused(connect: Connect, mock: Any) -> None:
    """A 200 without a `record` object raises FinalizerError (wrong base URL?)."""
    mock.post("/finalize").mock(return_value=httpx.Response(200, json={"status": "ok"}))
    with pytest.raises(FinalizerError, match="record"):
        connect(BASE).finalize(record_for("r-1"))


def test_answer_that_is_not_json_is_refused(connect: Connect, mock: Any) -> None:
    """A 200 whose body is not JSON raises FinalizerError quoting the start of the body."""
    mock.get("/health").mock(return_value=httpx.Response(200, text="<html>proxy</html>"))
    with pytest.raises(FinalizerError, match="not JSON"):
        connect(BASE).health()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"base_url": "finalizer:8000"}, "http:// or https://"),
        ({"token": ""}, "token is empty"),
        ({"run_id": ""}, "run_id is empty"),
        ({"max_retries": -1}, "max_retries"),
    ],
)
def test_unusable_options_are_refused(options: dict[str, Any], message: str) -> None:
    """A bad base URL, empty token or run id, or negative retries is a ValueError."""
    arguments = {"base_url": BASE, **options}
    with pytest.raises(ValueError, match=message):
        FinalizerClient(**arguments)
