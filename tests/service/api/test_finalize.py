"""POST /finalize, called in-process: answers, masking, enablement, sources, encodings."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
import zstandard

from tests.service.api.conftest import CaptureWriter, SettingsFactory
from tests.support.asgi import in_process
from tests.support.captures import agent_rollout, make_entry, record_for
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore, MemoryTokenStore
from token_finalizer.api import create_app


def test_captured_rollout_answers_the_rebuilt_record(
    client: httpx.Client, write_capture: CaptureWriter
) -> None:
    """A captured rollout answers 200 with its id, the source used, and a retirable build."""
    write_capture("r-1")
    answer = client.post("/finalize", json=record_for("r-1")).json()
    assert (answer["rollout_id"], answer["source"], answer["retirable"]) == ("r-1", "local", True)


def test_rebuilt_output_carries_the_captured_tokens(
    client: httpx.Client, write_capture: CaptureWriter
) -> None:
    """The record's last output item carries the last call's exact generated tokens."""
    entries = write_capture("r-1")
    answer = client.post("/finalize", json=record_for("r-1")).json()
    last_item = answer["record"]["response"]["output"][-1]
    assert last_item["generation_token_ids"] == entries[-1]["generation_token_ids"]


def test_fields_outside_the_output_are_untouched(
    client: httpx.Client, write_capture: CaptureWriter
) -> None:
    """Reward and harness fields come back exactly as they were posted."""
    write_capture("r-1")
    record = record_for("r-1", reward=0.25, harness={"steps": 7})
    answer = client.post("/finalize", json=record).json()
    assert (answer["record"]["reward"], answer["record"]["harness"]) == (0.25, {"steps": 7})


def test_finalize_does_not_retire(
    client: httpx.Client, write_capture: CaptureWriter, file_store: FileTokenStore
) -> None:
    """After finalize the capture is frozen but not retired."""
    write_capture("r-1")
    client.post("/finalize", json=record_for("r-1"))
    status = stored_state(file_store, "r-1")
    assert (status.frozen, status.retired) == (True, False)


def test_missing_capture_is_a_masked_200(client: httpx.Client) -> None:
    """A rollout with no capture answers 200 with a masked, non-retirable record."""
    response = client.post("/finalize", json=record_for("never-written"))
    answer = response.json()
    assert (response.status_code, answer["record"]["mask_sample"], answer["retirable"]) == (
        200,
        True,
        False,
    )


def test_malformed_rollout_id_is_a_masked_200_without_id(client: httpx.Client) -> None:
    """A malformed `_ng_rollout_id` is masked (200) and the answer's rollout_id is null."""
    response = client.post("/finalize", json=record_for("../etc"))
    answer = response.json()
    assert (response.status_code, answer["rollout_id"], answer["build"]["mask_sample"]) == (
        200,
        None,
        True,
    )


def test_record_without_id_is_masked_with_no_capture_key(client: httpx.Client) -> None:
    """A record naming no rollout is masked with the error `no capture key`."""
    answer = client.post("/finalize", json={"reward": 0.0}).json()
    assert answer["record"]["_ng_token_capture"]["error"] == "no capture key"


def test_agent_not_taking_part_gets_no_build(
    make_settings: SettingsFactory, write_capture: CaptureWriter
) -> None:
    """An agent outside `token_id_capture.agents` gets build null and its record unchanged."""
    write_capture("r-1")
    settings = make_settings(token_id_capture={"all_agents": False, "agents": ["other_agent"]})
    record = record_for("r-1")
    with in_process(create_app(settings)) as client:
        answer = client.post("/finalize", json=record).json()
    assert answer == {
        "rollout_id": "r-1",
        "source": "local",
        "record": record,
        "build": None,
        "retirable": False,
        "retire": None,
    }


def test_listed_agent_takes_part(
    make_settings: SettingsFactory, write_capture: CaptureWriter
) -> None:
    """An agent listed in `token_id_capture.agents` is finalized."""
    write_capture("r-1")
    settings = make_settings(token_id_capture={"all_agents": False, "agents": ["swe_agent"]})
    with in_process(create_app(settings)) as client:
        answer = client.post("/finalize", json=record_for("r-1")).json()
    assert answer["retirable"] is True


def test_source_query_selects_the_named_source(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    """`?source=NAME` freezes in that source's directory, not the default's."""
    other_dir = tmp_path / "other"
    settings = make_settings(sources={"other": {"kind": "file", "dir": str(other_dir)}})
    with in_process(create_app(settings)) as client:
        answer = client.post("/finalize?source=other", json=record_for("r-9")).json()
    assert (answer["source"], stored_state(FileTokenStore(other_dir), "r-9").frozen) == (
        "other",
        True,
    )


def test_unknown_source_is_404_naming_the_configured_ones(client: httpx.Client) -> None:
    """An unknown `?source=` answers 404 naming it and the configured sources."""
    response = client.post("/finalize?source=nowhere", json=record_for("r-1"))
    assert (response.status_code, response.json()) == (
        404,
        {"error": "unknown source 'nowhere'; configured sources: local"},
    )


def test_zstd_answer_when_asked(client: httpx.Client, write_capture: CaptureWriter) -> None:
    """With `Accept-Encoding: zstd` the answer is zstd-compressed and decodes to the same JSON."""
    write_capture("r-1")
    plain = client.post("/finalize", json=record_for("r-1")).json()
    request = {"json": record_for("r-1"), "headers": {"Accept-Encoding": "zstd"}}
    with client.stream("POST", "/finalize", **request) as response:
        raw = b"".join(response.iter_raw())  # the bytes as the app sent them, not decoded by httpx
    decoded = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
    assert (response.headers["content-encoding"], orjson.loads(decoded)) == ("zstd", plain)


def test_large_rollout_answer_is_complete(
    client: httpx.Client, write_capture: CaptureWriter
) -> None:
    """A rollout large enough to be encoded off the event loop delivers every generated token."""
    write_capture("big", calls=30, new_tokens_per_turn=500)
    answer = client.post("/finalize", json=record_for("big")).json()
    metrics = answer["build"]["metrics"]
    assert metrics["generated_tokens_delivered"] == 30 * 125


def test_large_zstd_answer_matches_the_identity_answer(
    client: httpx.Client, write_capture: CaptureWriter
) -> None:
    """A large answer (encoded off the loop, output spliced) is the same JSON zstd or not."""
    write_capture("big", calls=30, new_tokens_per_turn=500)
    plain = client.post(
        "/finalize", json=record_for("big"), headers={"Accept-Encoding": "identity"}
    )
    packed = client.post("/finalize", json=record_for("big"), headers={"Accept-Encoding": "zstd"})
    assert (packed.headers["content-encoding"], packed.content) == ("zstd", plain.content)


# -- answer v2: the build without its response, the retire object, mask reasons -------------


def test_build_leaves_the_rebuilt_output_to_the_record(
    client: httpx.Client, write_capture: CaptureWriter
) -> None:
    """The answer's build has no `rebuilt_response`; the rebuilt output is in the record only."""
    write_capture("r-1")
    answer = client.post("/finalize", json=record_for("r-1")).json()
    output = answer["record"]["response"]["output"]
    assert ("rebuilt_response" in answer["build"], len(output)) == (False, 3)
    assert all("prompt_token_ids" in item for item in output)


def test_retirable_answer_carries_the_retire_object(
    client: httpx.Client, write_capture: CaptureWriter
) -> None:
    """A retirable answer's `retire` names the rollout, source and consumed snapshot, signed."""
    write_capture("r-1")
    answer = client.post("/finalize", json=record_for("r-1")).json()
    retire = answer["retire"]
    assert set(retire) == {"rollout_id", "source", "snapshot_id", "version", "ticket"}
    assert (retire["rollout_id"], retire["source"]) == ("r-1", "local")
    assert {"snapshot_id": retire["snapshot_id"], "version": retire["version"]} == answer["build"][
        "_capture_snapshot"
    ]
    assert re.fullmatch(r"[0-9a-f]{64}", retire["ticket"])


def test_masked_answer_carries_no_retire_object(client: httpx.Client) -> None:
    """A masked answer is not retirable: `retirable` false and `retire` null."""
    answer = client.post("/finalize", json=record_for("never-written")).json()
    assert (answer["retirable"], answer["retire"]) == (False, None)


def test_built_build_lists_unresolved_parent_calls(
    client: httpx.Client, write_capture: CaptureWriter
) -> None:
    """A built build carries `unresolved_parent_calls` (empty for a clean chain)."""
    write_capture("r-1")
    build = client.post("/finalize", json=record_for("r-1")).json()["build"]
    assert (build["unresolved_parent_calls"], build["unresolved_retries"]) == ([], [])


def test_unmasked_build_has_no_mask_reason(
    client: httpx.Client, write_capture: CaptureWriter
) -> None:
    """A clean build names no mask reason, in the build or in the record's capture metrics."""
    write_capture("r-1")
    answer = client.post("/finalize", json=record_for("r-1")).json()
    assert "mask_reason" not in answer["build"]
    assert "mask_reason" not in answer["record"]["_ng_token_capture"]


Steps = Callable[[str], list[tuple[str, tuple[Any, ...]]]]

MASK_CASES: dict[str, Steps] = {
    "empty_capture": lambda r: [],
    "capture_incomplete": lambda r: [
        *[("put", (e,)) for e in agent_rollout(r, calls=2, new_tokens_per_turn=20)],
        ("mark_incomplete", (r, "lost")),
    ],
    "multiple_roots": lambda r: [
        ("put", (make_entry(r, "a", [1, 2], [3], created_at=1.0),)),
        ("put", (make_entry(r, "b", [7, 8], [9], created_at=2.0),)),
    ],
    "unresolved_retries": lambda r: [
        ("put", (make_entry(r, "try-1", [1, 2], [3]),)),
        ("put", (make_entry(r, "try-2", [1, 2], [4]),)),
    ],
}


@pytest.mark.parametrize("reason", sorted(MASK_CASES))
def test_masked_build_names_its_mask_reason(make_settings: SettingsFactory, reason: str) -> None:
    """A masked build carries its machine-readable `mask_reason`, also in `_ng_token_capture`."""
    store = MemoryTokenStore()

    async def write() -> None:
        for method, args in MASK_CASES[reason]("r-1"):
            await getattr(store, method)(*args)

    anyio.run(write)
    with in_process(create_app(make_settings(), sources={"mem": store})) as client:
        answer = client.post("/finalize?source=mem", json=record_for("r-1")).json()
    assert (answer["build"]["mask_sample"], answer["build"]["mask_reason"]) == (True, reason)
    assert answer["record"]["_ng_token_capture"]["mask_reason"] == reason


class _UnreachableStore(MemoryTokenStore):
    """A store whose freeze fails, as an unreachable capture store's would."""

    async def freeze(self, rollout_id: str) -> Any:
        raise ConnectionError("capture store refused the connection")


def test_failed_freeze_is_masked_as_freeze_failed(make_settings: SettingsFactory) -> None:
    """A freeze that raises masks the record with mask_reason `freeze_failed`."""
    app = create_app(make_settings(), sources={"down": _UnreachableStore()})
    with in_process(app) as client:
        answer = client.post("/finalize?source=down", json=record_for("r-1")).json()
    assert (answer["build"]["mask_reason"], answer["retire"]) == ("freeze_failed", None)
    assert answer["record"]["_ng_token_capture"]["mask_reason"] == "freeze_failed"
