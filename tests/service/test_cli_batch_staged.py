"""`token-finalizer finalize` / `retire` over externally staged rollouts (in process, --config).

The batch output carries each answer's `staged` verdict (the verified row as
plain JSON lists), and `retire` of that output deletes the staged rollout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio

from tests.support.staging_stores import Conversation
from token_finalizer import FileTokenStore
from token_finalizer.cli import main

RETIRE_KEY = "batch-staged-retire-key-0123456789abcdef"


def _staged(directory: Path, chat: Conversation) -> None:
    async def write() -> None:
        store = FileTokenStore(directory)
        try:
            for record, row in zip(chat.records, chat.rows, strict=True):
                await store.stage(record)
                await store.record_ledger_row(chat.rollout_id, row)
        finally:
            await store.close()

    anyio.run(write)


def _batch(tmp_path: Path) -> tuple[Path, Conversation, Path]:
    """A staged rollout in a capture directory, its record in IN.jsonl, the config."""
    captures = tmp_path / "capture"
    chat = Conversation.of("batch-staged", 3)
    _staged(captures, chat)
    record = {"_ng_rollout_id": chat.rollout_id, "response": {"id": "resp-c3"}, "reward": 1.0}
    (tmp_path / "in.jsonl").write_text(json.dumps(record) + "\n")
    config = tmp_path / "finalizer.yaml"
    sources = {"default": "local", "local": {"kind": "file", "dir": str(captures)}}
    config.write_text(json.dumps({"sources": sources, "retire": {"key": RETIRE_KEY}}))
    return captures, chat, config


def _answer(path: Path) -> dict[str, Any]:
    (line,) = path.read_text().splitlines()
    answer: dict[str, Any] = json.loads(line)
    return answer


def test_the_output_carries_the_verified_row(tmp_path: Path) -> None:
    """Each output line holds `staged` with the row's token ids as a plain list."""
    _, chat, config = _batch(tmp_path)
    out = tmp_path / "out.jsonl"
    assert (
        main(["finalize", str(tmp_path / "in.jsonl"), "-o", str(out), "--config", str(config)]) == 0
    )
    tokens = [int(t) for record in chat.records for t in record.token_ids_delta]
    assert _answer(out)["staged"]["row"]["token_ids"] == tokens


def test_retiring_the_output_deletes_the_staged_rollout(tmp_path: Path) -> None:
    """`retire` of the finalize output drops the staged rollout: nothing staged is left."""
    captures, chat, config = _batch(tmp_path)
    out = tmp_path / "out.jsonl"
    main(["finalize", str(tmp_path / "in.jsonl"), "-o", str(out), "--config", str(config)])
    assert main(["retire", str(out), "--config", str(config)]) == 0

    async def left() -> Any:
        store = FileTokenStore(captures)
        try:
            return await store.fetch_staged(chat.rollout_id, ["c1", "c2", "c3"])
        finally:
            await store.close()

    assert anyio.run(left) == (None, None, None)
