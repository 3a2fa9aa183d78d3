"""What the clients send and how they read odd answers (respx unit tests)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import pytest
import respx

from tests.client.conftest import Connect
from tests.support.captures import record_for
from token_finalizer_client import Finalized, FinalizerClient, FinalizerError

BASE = "http://finalizer.test"
BUILD = {
    "rollout_id": "r-1",
    "rebuilt_response": {"id": "proj-r-1", "output": [{"generation_token_ids": [1] * 1000}]},
    "metrics": {"n_calls": 1},
    "mask_sample": False,
    "_capture_snapshot": {"snapshot_id": "s", "version": 3},
}
ANSWER = {
    "rollout_id": "r-1",
    "source": "local",
    "record": record_for("r-1"),
    "build": BUILD,
    "retirable": True,
}


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


def test_retire_sends_no_rebuilt_tokens(connect: Connect, mock: Any) -> None:
    """The retire body keeps the build's flags and snapshot but stubs the rebuilt tokens."""
    route = mock.post("/retire").mock(return_value=httpx.Response(200, json={"retired": True}))
    connect(BASE).retire(Finalized.from_answer(ANSWER))
    body = json.loads(route.calls.last.request.content)
    assert body["build"]["rebuilt_response"] == {"id": "proj-r-1"}
    assert body["build"]["_capture_snapshot"] == BUILD["_capture_snapshot"]
    assert (body["rollout_id"], body["source"]) == ("r-1", "local")


def test_retire_source_argument_overrides_the_answer(connect: Connect, mock: Any) -> None:
    """retire(finalized, source=NAME) retires through NAME, not the answer's source."""
    route = mock.post("/retire").mock(return_value=httpx.Response(200, json={"retired": True}))
    connect(BASE).retire(Finalized.from_answer(ANSWER), source="train-b")
    assert json.loads(route.calls.last.request.content)["source"] == "train-b"


def test_non_retirable_result_makes_no_request(connect: Connect, mock: Any) -> None:
    """Retiring a Finalized that is not retirable answers False without calling the service."""
    route = mock.post("/retire").mock(return_value=httpx.Response(200, json={"retired": True}))
    masked = Finalized.from_answer({**ANSWER, "retirable": False})
    assert connect(BASE).retire(masked) is False
    assert route.call_count == 0


def test_retire_with_both_forms_is_a_type_error(connect: Connect) -> None:
    """Passing a Finalized and rollout_id= together is refused before any request."""
    with pytest.raises(TypeError, match="not both"):
        connect(BASE).retire(Finalized.from_answer(ANSWER), rollout_id="r-2")


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
