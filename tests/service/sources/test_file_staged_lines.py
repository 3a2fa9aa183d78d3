"""The file store's staged lines: token columns packed at rest, lines of 0.3.0 still read.

docs/staging.md#storage. A staged call's line holds its columns in their
narrowest exact form (`packed_columns`, docs/staging.md#packed-at-rest); a
line written before (the columns as lists) reads back as the same call, and
staging that call again is an identical replay. 0.4.0's lines:
test_staged_old_data.py.
"""

from __future__ import annotations

import base64
from pathlib import Path

import orjson
import pytest

from tests.support.staging_stores import Conversation
from token_finalizer import FileTokenStore
from token_finalizer.core.errors import CaptureConflict, CaptureCorrupt
from token_finalizer.core.staging import PACKED_COLUMNS, StagedCallRecord
from token_finalizer.sources._staged_packed import COLUMNS_MAGIC
from token_finalizer.sources._staging import (
    file_line,
    parse_file_line,
    parse_staged_call,
    same_staged_line,
)

pytestmark = pytest.mark.anyio

RID = "lines"
ROUTED = {"routed_experts": [[1, 2]]}


def _record(call: int = 1) -> StagedCallRecord:
    chat = Conversation(RID)
    for index in range(1, call + 1):
        chat.add(f"c{index}", extras=ROUTED)
    return chat.records[call - 1]


def _old_line(record: StagedCallRecord) -> bytes:
    """The line 0.3.0 wrote: the whole record, columns as lists, sorted keys."""
    return orjson.dumps(
        {"attachments": None, "record": record.to_json()}, option=orjson.OPT_SORT_KEYS
    )


def test_a_staged_line_holds_its_columns_packed() -> None:
    """The line's record leaves the three columns out; `packed_columns` holds them."""
    stored = orjson.loads(file_line(_record(), None))
    assert set(stored) == {"attachments", "packed_columns", "record"}
    assert base64.b64decode(stored["packed_columns"]).startswith(COLUMNS_MAGIC)
    assert not set(PACKED_COLUMNS) & set(stored["record"])


def test_a_packed_line_reads_back_as_the_record_it_stored() -> None:
    """Parsed, a packed line is the record (columns as arrays), extras and all."""
    record = _record()
    parsed, attachments = parse_file_line(file_line(record, None), "test")
    assert attachments is None
    assert StagedCallRecord.from_json(parsed) == record


def test_an_old_line_reads_back_as_the_same_record() -> None:
    """A line with the columns as lists (0.3.0) is read as before."""
    record = _record()
    parsed, _ = parse_file_line(_old_line(record), "test")
    assert StagedCallRecord.from_json(parsed) == record


def test_the_freeze_gets_the_columns_and_the_extras_apart() -> None:
    """parse_staged_call decodes the columns once and takes the extras off the record."""
    record = _record()
    call = parse_staged_call(file_line(record, None), "test")
    assert (call.columns, call.extras, "extras" in call.record) == (None, ROUTED, False)
    assert StagedCallRecord.from_json({**call.base(), "extras": ROUTED}) == record


def test_one_call_in_either_form_is_the_same_line() -> None:
    """An old line and a packed line of one call are the same call; another call is not."""
    record, other = _record(1), _record(2)
    assert same_staged_line(_old_line(record), file_line(record, None), "test")
    assert not same_staged_line(_old_line(record), file_line(other, None), "test")
    assert not same_staged_line(file_line(record, None), file_line(record, {"a": {"json": 1}}), "t")


async def test_staging_again_over_an_old_line_is_an_identical_replay(tmp_path: Path) -> None:
    """A call staged by 0.3.0, staged again after the upgrade: a replay, not a conflict."""
    record = _record()
    (tmp_path / f"{RID}.staged.jsonl").write_bytes(_old_line(record) + b"\n")
    store = FileTokenStore(tmp_path)
    try:
        assert await store.stage(record) is False
        different = _record(1)
        object.__setattr__(different, "extras", {"routed_experts": [[9, 9]]})
        with pytest.raises(CaptureConflict):
            await store.stage(different)
    finally:
        await store.close()


async def test_torn_packed_columns_fail_the_freeze_as_corrupt(tmp_path: Path) -> None:
    """Packed columns that are not base64 are the capture's corruption, named at the freeze."""
    chat = Conversation(RID)
    chat.add("c1")
    store = FileTokenStore(tmp_path)
    try:
        await store.stage(chat.records[0])
        await store.record_ledger_row(RID, chat.rows[0])
        staged = tmp_path / f"{RID}.staged.jsonl"
        line = orjson.loads(staged.read_bytes())
        line["packed_columns"] = "!!!!"
        staged.write_bytes(orjson.dumps(line, option=orjson.OPT_SORT_KEYS) + b"\n")
        reopened = FileTokenStore(tmp_path)
        with pytest.raises(CaptureCorrupt, match="c1"):
            await reopened.freeze(RID)
        await reopened.close()
    finally:
        await store.close()
