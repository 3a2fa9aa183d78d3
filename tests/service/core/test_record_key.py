"""A record's capture key is derived once on the finalize path and handed on."""

from __future__ import annotations

import pytest

from tests.support.captures import make_entry, record_for
from token_finalizer import MemoryTokenStore
from token_finalizer.core import delivery, identity
from token_finalizer.core.delivery import finalize_record
from token_finalizer.core.identity import RecordKey, record_key

pytestmark = pytest.mark.anyio


def test_a_malformed_id_is_kept_as_a_value() -> None:
    """record_key does not raise for a malformed id: it returns the refusal."""
    key = record_key({"_ng_rollout_id": "a/b"})
    assert key.rollout_id is None and key.malformed is not None


def test_a_record_without_an_id_has_no_key() -> None:
    """A record naming no rollout has neither an id nor a refusal."""
    assert record_key({"response": {}}) == RecordKey(None)


async def test_finalize_record_uses_the_key_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a key, finalize_record freezes that rollout and derives nothing again."""
    store = MemoryTokenStore()
    await store.put(make_entry("r1", "c1", [1, 2], [3]))

    def derived_again(record: object) -> str | None:
        raise AssertionError("the rollout id was derived a second time")

    monkeypatch.setattr(identity, "rollout_id_of", derived_again)
    monkeypatch.setattr(delivery, "record_key", lambda record: derived_again(record))
    build = await finalize_record(record_for("r1"), store, key=RecordKey("r1"))
    assert build is not None and not build.mask_sample
