"""The file store on a full disk: StoreFull (507 from the store server), nothing half-written.

Faults are injected at the system call: `os.write` or `os.fsync` raise ENOSPC
(or EDQUOT, EFBIG) for files of the capture directory only, from the n-th
such call on, until "space is back".
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.asgi import in_process
from tests.support.captures import make_entry, record_for
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore
from token_finalizer.core.delivery import finalize_rollout_token_capture
from token_finalizer.core.errors import StoreFull
from token_finalizer.sources.http import HttpTokenSource
from token_finalizer.store_server import create_store_app

pytestmark = pytest.mark.anyio

PREFIX = "/ng-rollout/r-full/training-token-capture"


class DiskFull:
    """Makes `os.<call>` fail with `code` for files directly inside `directory`.

    The first `skip` matching calls still succeed (so the fault can hit the
    state write after the jsonl append); `space_is_back()` ends the fault.
    """

    def __init__(self, directory: Path, call: str, code: int, skip: int) -> None:
        self.directory = str(directory.resolve())
        self.call, self.code, self.skip = call, code, skip
        self.failed = 0
        self.real: Callable[..., Any] = getattr(os, call)
        self.on = True

    def _ours(self, fd: int) -> bool:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False
        return os.path.dirname(target) == self.directory

    def __call__(self, fd: int, *args: Any) -> Any:
        if self.on and self._ours(fd):
            if self.skip > 0:
                self.skip -= 1
            else:
                self.failed += 1
                raise OSError(self.code, os.strerror(self.code))
        return self.real(fd, *args)

    def space_is_back(self) -> None:
        self.on = False


@contextlib.contextmanager
def disk_full(
    monkeypatch: pytest.MonkeyPatch,
    directory: Path,
    *,
    call: str = "write",
    code: int = errno.ENOSPC,
    skip: int = 0,
) -> Iterator[DiskFull]:
    fault = DiskFull(directory, call, code, skip)
    with monkeypatch.context() as patch:
        patch.setattr(os, call, fault)
        yield fault


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# The jsonl append is the first write (and the only fsync) of a new put; the state's temp
# file the second write (a put's state is rebuilt from the jsonl, so it is not fsynced).
WHERE = [
    pytest.param("write", 0, "r-full.tokens.jsonl", id="jsonl-write"),
    pytest.param("fsync", 0, "r-full.tokens.jsonl", id="jsonl-fsync"),
    pytest.param("write", 1, "r-full.tokens.state.json", id="state-write"),
]


@pytest.mark.parametrize(("call", "skip", "failing"), WHERE)
def test_put_on_a_full_disk_answers_507_and_keeps_the_capture(
    capture_dir: Path, monkeypatch: pytest.MonkeyPatch, call: str, skip: int, failing: str
) -> None:
    """507 with a clear message; the files are byte for byte as before; a later put works."""
    store = FileTokenStore(capture_dir)
    with in_process(create_store_app(store)) as http:
        first = http.put(f"{PREFIX}/calls/c1", json=make_entry("r-full", "c1", [1], [2]))
        assert first.status_code == 200
        before = _files(capture_dir)
        entry = make_entry("r-full", "c2", [1, 2, 3], [4])

        with disk_full(monkeypatch, capture_dir, call=call, skip=skip) as fault:
            refused = http.put(f"{PREFIX}/calls/c2", json=entry)
            assert fault.failed >= 1  # the undo's own fsync may fail too: it is best effort
            assert _files(capture_dir) == before  # nothing half-written, no temp file left
            fault.space_is_back()
            stored = http.put(f"{PREFIX}/calls/c2", json=entry)
        frozen = http.post(f"{PREFIX}/freeze")

    assert refused.status_code == 507
    message = refused.json()["error"]
    assert "out of space" in message and failing in message
    assert "No space left on device" in message
    assert str(capture_dir) not in message
    assert stored.status_code == 200
    snapshot = frozen.json()
    assert [e["model_call_id"] for e in snapshot["entries"]] == ["c1", "c2"]
    assert (snapshot["incomplete"], snapshot["version"]) == (False, 3)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
async def test_every_no_space_error_is_store_full(
    file_store: FileTokenStore, capture_dir: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """Disk full, quota exceeded, file too large: all StoreFull, none a bare OSError."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    with disk_full(monkeypatch, capture_dir, code=code):
        with pytest.raises(StoreFull, match=os.strerror(code)):
            await file_store.put(make_entry("r1", "c2", [1, 2, 3], [4]))
        with pytest.raises(StoreFull):
            await file_store.begin_call("r1", "c3")
    assert [e.model_call_id for e in (await file_store.freeze("r1")).entries] == ["c1"]
    assert not (capture_dir / "r1.tokens.intents").read_bytes()


def test_freeze_on_a_full_disk_answers_507_and_freezes_nothing(
    capture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A freeze that cannot write its state is refused; the capture stays open and writable."""
    store = FileTokenStore(capture_dir)
    with in_process(create_store_app(store)) as http:
        http.put(f"{PREFIX}/calls/c1", json=make_entry("r-full", "c1", [1], [2]))
        with disk_full(monkeypatch, capture_dir):
            refused = http.post(f"{PREFIX}/freeze")
        later = http.put(f"{PREFIX}/calls/c2", json=make_entry("r-full", "c2", [1, 2, 3], [4]))
    assert refused.status_code == 507
    assert "r-full.tokens.state.json" in refused.json()["error"]
    assert later.status_code == 200
    assert stored_state(store, "r-full").frozen is False


async def test_finalize_masks_with_store_full_when_the_freeze_hits_it(
    file_store: FileTokenStore, capture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finalizer masks the record, naming StoreFull; once space is back it builds."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    with disk_full(monkeypatch, capture_dir):
        build = await finalize_rollout_token_capture(record_for("r1"), file_store)
    assert build is not None and build["mask_sample"] is True
    assert build["mask_reason"] == "freeze_failed"
    assert build["error"].startswith("StoreFull: the capture store is out of space")
    assert stored_state(file_store, "r1").frozen is False


async def test_mark_incomplete_on_a_full_disk_is_not_lost(
    file_store: FileTokenStore, capture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failed call's id got in, its state did not: the snapshot is incomplete all the same."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    with disk_full(monkeypatch, capture_dir, skip=1), pytest.raises(StoreFull):
        await file_store.mark_incomplete("r1", "c2")
    assert (await file_store.freeze("r1")).incomplete is True


async def test_remote_finalize_masks_with_the_store_servers_507(
    file_store: FileTokenStore, capture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over protocol v1 the finalizer's http source masks too, quoting the 507 message."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    transport = httpx.ASGITransport(app=create_store_app(file_store))
    source = HttpTokenSource("http://store.test", transport=transport)
    try:
        with disk_full(monkeypatch, capture_dir):
            build = await finalize_rollout_token_capture(record_for("r1"), source)
    finally:
        await source.close()
    assert build is not None and build["mask_sample"] is True
    assert "HTTP 507" in build["error"] and "out of space" in build["error"]
    assert stored_state(file_store, "r1").frozen is False
