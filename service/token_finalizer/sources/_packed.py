"""Entries packed and deduplicated at rest, invisible to readers.

A stored entry is either its canonical line (`_entries.entry_payload`: compact
sorted-key JSON, starting with `{`) or a packed record (starting with
`PACKED_MAGIC`): the line's text without its three token arrays (the
"skeleton"), the arrays as packed little-endian numbers (ids as u32 when all
fit, else u64; log probs as f32 only when every value round-trips, else f64),
and, for a full prompt that starts with the cumulative ids of an earlier call
of the rollout (its lineage parent), a reference to that call and a prefix
length instead of those ids. The packed bytes after the header are
zstd-compressed when that is smaller. A record is kept only when expanding it
gives back the canonical line byte for byte (checked at put time), so every
reader sees exactly what was written. See docs/store-protocol.md#packed-at-rest.

Expansion needs the cumulative ids (prompt + generation) of the referenced
call: `RolloutIds` keeps them per call as views of shared tapes, O(context)
per chain, fed in put order.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import zstandard

from token_finalizer._constants import ZSTD_LEVEL
from token_finalizer.core.codec import dumps_entry_line
from token_finalizer.core.entries import TokenEntry
from token_finalizer.core.errors import CaptureCorrupt
from token_finalizer.core.tape import Tape
from token_finalizer.core.token_ids import NARROW, Ids, join_ids, narrowest, same_ids

__all__ = [
    "FILE_MARKER",
    "PACKED_MAGIC",
    "Packed",
    "RolloutIds",
    "StoredParts",
    "expand_lines",
    "file_line",
    "from_file_line",
    "is_packed",
    "pack",
    "record_base",
    "record_call",
    "render_from",
    "stored_value",
]

PACKED_MAGIC = b"\x93NGP1"
# A packed record in a jsonl file: this byte, then base85 of the record (no newline, no `{`
# first: a plain line always starts with `{`).
FILE_MARKER = b"~"

FULL, REF, DELTA = 0, 1, 2  # the prompt as written / parent prefix + suffix / Gym delta record
_FIELDS = ("generation_log_probs", "generation_token_ids", "prompt_token_ids")  # sorted order
_HOLE = "\u0000ng-packed-hole:"
_HEADER = struct.Struct("<BBBBBBQQQIIIIHHB")
_COMPRESSED = 1
_STDLIB_FLOATS = 2
_EMPTY_IDS = np.empty(0, dtype=np.int32)


@dataclass(frozen=True, slots=True)
class Packed:
    """One entry's packed record, with the call id and canonical line digest it holds."""

    call_id: str
    digest: str
    record: bytes
    base: str | None  # the call whose ids the prompt starts with (a reference), or None


def is_packed(stored: bytes) -> bool:
    """Whether a stored value is a packed record (else a canonical line)."""
    return stored.startswith(PACKED_MAGIC)


def file_line(record: bytes) -> bytes:
    """A packed record as one line of a jsonl file."""
    return FILE_MARKER + base64.b85encode(record)


def from_file_line(line: bytes) -> bytes:
    """The stored value of one jsonl line: a packed record decoded, a plain line as is."""
    if line.startswith(FILE_MARKER):
        try:
            return base64.b85decode(line[1:])
        except ValueError as exc:
            raise CaptureCorrupt(f"an unreadable packed line: {exc}") from None
    return line


def _planes(values: np.ndarray) -> bytes:
    """The numbers' bytes, byte plane by byte plane (all first bytes, then all second...):
    the high bytes of ids below a 150k vocabulary are nearly constant, and zstd then
    squeezes them to almost nothing."""
    width = values.dtype.itemsize
    return np.frombuffer(values.tobytes(), dtype=np.uint8).reshape(-1, width).T.tobytes()


def _from_planes(data: bytes, at: int, count: int, dtype: str) -> np.ndarray:
    width = np.dtype(dtype).itemsize
    planes = np.frombuffer(data, dtype=np.uint8, count=count * width, offset=at)
    return np.frombuffer(planes.reshape(width, count).T.tobytes(), dtype=dtype)


def _ids_width(ids: Ids) -> tuple[int, bytes]:
    if len(ids) and int(ids.max()) >= 2**32:
        return 8, _planes(ids.astype("<u8", copy=False))
    return 4, _planes(ids.astype("<u4", copy=False))


def _log_probs_width(values: np.ndarray) -> tuple[int, bytes]:
    narrow = values.astype("<f4")
    back = narrow.astype(np.float64)
    # NaN never equals itself: compare bit patterns of the round trip instead.
    if np.array_equal(back.view(np.uint64), values.astype(np.float64).view(np.uint64)):
        return 4, _planes(narrow)
    return 8, _planes(values.astype("<f8", copy=False))


def _ids_text(ids: Ids) -> bytes:
    return orjson.dumps(ids, option=orjson.OPT_SERIALIZE_NUMPY)


def _log_probs_text(values: np.ndarray, stdlib: bool) -> bytes:
    if stdlib:
        return json.dumps(values.tolist(), separators=(",", ":")).encode()
    return orjson.dumps(values.astype(np.float64, copy=False), option=orjson.OPT_SERIALIZE_NUMPY)


def _skeleton(payload: Mapping[str, Any], line: bytes) -> tuple[list[bytes], bool] | None:
    """The line's text around its three token arrays, and whether its floats are the
    stdlib's (a line with non-finite log probs); None when the line cannot be cut so."""
    if not all(isinstance(payload.get(name), list | np.ndarray) for name in _FIELDS):
        return None
    holes = {name: f"{_HOLE}{index}" for index, name in enumerate(_FIELDS)}
    # The same choice of encoder as `dumps_entry_line`.
    stdlib = not all(map(math.isfinite, payload["generation_log_probs"]))
    shaped = {**payload, **holes}
    if stdlib:
        text = json.dumps(shaped, sort_keys=True, separators=(",", ":")).encode()
        marks = [json.dumps(hole).encode() for hole in holes.values()]
    else:
        text = dumps_entry_line(shaped)
        marks = [orjson.dumps(hole) for hole in holes.values()]
    pieces: list[bytes] = []
    rest = text
    for mark in marks:
        head, found, rest = rest.partition(mark)
        if not found or mark in rest:
            return None
        pieces.append(head)
    pieces.append(rest)
    return pieces, stdlib


def pack(
    payload: Mapping[str, Any],
    line: bytes,
    digest: str,
    parsed: TokenEntry,
    known: RolloutIds,
) -> Packed | None:
    """The packed record of an entry whose canonical line is `line`, or None to store the
    line as it is (a shape that would not expand to the same bytes)."""
    cut = _skeleton(payload, line)
    if cut is None:
        return None
    pieces, stdlib = cut
    prompt = parsed.prompt_token_ids
    mode, base, prefix = FULL, "", 0
    parent = parsed.parent_call_id if parsed.parent_resolution == "resolved" else None
    if parsed.prompt_is_delta and parent:
        mode, base = DELTA, parent
    elif parent:
        cumulative = known.get(parent)
        if (
            cumulative is not None
            and 0 < len(cumulative) <= len(prompt)
            and same_ids(prompt[: len(cumulative)], cumulative)
        ):
            mode, base, prefix = REF, parent, len(cumulative)
            prompt = prompt[prefix:]
    prompt_width, prompt_bytes = _ids_width(prompt)
    generation_width, generation_bytes = _ids_width(parsed.generation_token_ids)
    log_probs_width, log_probs_bytes = _log_probs_width(parsed.generation_log_probs)
    body = b"".join((*pieces, prompt_bytes, generation_bytes, log_probs_bytes))
    flags = _STDLIB_FLOATS if stdlib else 0
    squeezed = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(body)
    if len(squeezed) < len(body):
        body, flags = squeezed, flags | _COMPRESSED
    call = parsed.model_call_id.encode()
    base_bytes = base.encode()
    header = _HEADER.pack(
        flags,
        mode,
        prompt_width,
        generation_width,
        log_probs_width,
        0,
        prefix,
        len(prompt),
        len(parsed.generation_token_ids),
        *map(len, pieces),
        len(call),
        len(base_bytes),
        len(digest),
    )
    record = b"".join((PACKED_MAGIC, header, call, base_bytes, digest.encode(), body))
    # Kept only when it reads back as the very line (any encoder quirk: the line itself).
    if known.copy_for_probe().expand(record) != line:
        return None
    return Packed(parsed.model_call_id, digest, record, base if mode == REF else None)


@dataclass(frozen=True, slots=True)
class StoredParts:
    """A packed record read for a reader: its canonical line's text with the three token
    arrays left empty (`skeleton`, compact JSON), and those arrays as the line holds them
    (the whole prompt: a reference's is a view of the tape its base's ids are on)."""

    skeleton: bytes
    prompt: Ids
    generation: Ids
    log_probs: np.ndarray


@dataclass(frozen=True, slots=True)
class _Record:
    flags: int
    mode: int
    call_id: str
    base: str
    prefix: int
    digest: str
    pieces: tuple[bytes, bytes, bytes, bytes]
    prompt: Ids
    generation: Ids
    log_probs: np.ndarray


def _read_ids(data: bytes, at: int, count: int, width: int) -> tuple[Ids, int]:
    dtype = "<u8" if width == 8 else "<u4"
    end = at + count * width
    ids = _from_planes(data, at, count, dtype) if count else _EMPTY_IDS
    return narrowest(ids.astype(np.uint64)) if count else ids, end


def _parse(record: bytes) -> _Record:
    try:
        at = len(PACKED_MAGIC)
        fields = _HEADER.unpack_from(record, at)
        at += _HEADER.size
        flags, mode, prompt_width, generation_width, log_probs_width, _ = fields[:6]
        prefix, prompt_count, generation_count = fields[6:9]
        piece_lengths = fields[9:13]
        call_length, base_length, digest_length = fields[13:16]
        call_id = record[at : at + call_length].decode()
        at += call_length
        base = record[at : at + base_length].decode()
        at += base_length
        digest = record[at : at + digest_length].decode()
        at += digest_length
        body = record[at:]
        if flags & _COMPRESSED:
            body = zstandard.ZstdDecompressor().decompress(body)
        pieces = []
        at = 0
        for length in piece_lengths:
            pieces.append(body[at : at + length])
            at += length
        prompt, at = _read_ids(body, at, prompt_count, prompt_width)
        generation, at = _read_ids(body, at, generation_count, generation_width)
        lp_dtype = "<f8" if log_probs_width == 8 else "<f4"
        log_probs = _from_planes(body, at, generation_count, lp_dtype)
        if at + generation_count * log_probs_width != len(body):
            raise ValueError("the record's length does not match its header")
    except (struct.error, ValueError, UnicodeDecodeError, zstandard.ZstdError) as exc:
        raise CaptureCorrupt(f"an unreadable packed entry: {exc}") from None
    return _Record(
        flags,
        mode,
        call_id,
        base,
        prefix,
        digest,
        (pieces[0], pieces[1], pieces[2], pieces[3]),
        prompt,
        generation,
        log_probs.astype(np.float64),
    )


def record_base(record: bytes) -> str | None:
    """The call a packed record refers to for its prompt's prefix, or None."""
    parsed = _parse(record)
    return parsed.base if parsed.mode == REF else None


def render_from(call_id: str, values: Mapping[str, bytes]) -> bytes | None:
    """The canonical line of `call_id` from stored values holding its reference chain
    (each referred call's value); None when one of them is missing."""
    chain: list[bytes] = []
    at: str | None = call_id
    while at is not None:
        value = values.get(at)
        if value is None or len(chain) > len(values):
            return None
        chain.append(value)
        at = record_base(value) if is_packed(value) else None
    known = RolloutIds()
    line = b""
    for value in reversed(chain):
        line = known.expand(value)
    return line


def record_call(record: bytes) -> tuple[str, str]:
    """The call id and canonical line digest a packed record holds (header only)."""
    parsed = _parse(record)
    return parsed.call_id, parsed.digest


class RolloutIds:
    """The cumulative ids (prompt + generation) of a rollout's calls, fed in put order.

    Each call's ids are a view of a tape that the next call of its chain
    extends in place (a branch copies), so a linear rollout holds its final
    context once. Packed records teach their call's ids as they are read; a
    plain line is parsed only if a later record refers to a call it holds.
    """

    __slots__ = ("_calls", "_ends", "_plain")

    def __init__(self) -> None:
        self._calls: dict[str, tuple[Tape, int]] = {}
        self._ends: dict[int, str] = {}  # id(tape) -> the call whose ids end it
        # Plain lines not parsed yet, and entries parsed by a reader but not learnt yet:
        # learnt only when a later record refers to a call they hold.
        self._plain: list[bytes | TokenEntry] = []

    def __len__(self) -> int:
        return len(self._calls)

    def get(self, call_id: str) -> Ids | None:
        """The call's cumulative ids, or None when they are not known here."""
        held = self._calls.get(call_id)
        if held is None and self._plain:
            self._parse_plain()
            held = self._calls.get(call_id)
        return None if held is None else held[0].view(held[1])

    def tokens(self) -> int:
        """How many ids the tapes hold (each tape once)."""
        tapes = {id(tape): tape.length for tape, _ in self._calls.values()}
        return sum(tapes.values())

    def copy_for_probe(self) -> RolloutIds:
        """A copy to expand a candidate record in, without touching these tapes' ends."""
        probe = RolloutIds()
        probe._calls = dict(self._calls)
        return probe  # no tape ends: every extension in the probe branches off a copy

    def _parse_plain(self) -> None:
        pending, self._plain = self._plain, []
        for line in pending:
            self.learn_entry(line if isinstance(line, TokenEntry) else TokenEntry.from_json(line))

    def _extend(self, call_id: str, base: str, length: int, parts: Iterable[Ids]) -> None:
        held = self._calls.get(base)
        if held is None:
            return
        tape, end = held
        if self._ends.get(id(tape)) != base or tape.length != end or length != end:
            tape = Tape(tape.view(length))
        for part in parts:
            tape.append(part)
        self._settle(call_id, tape)

    def _settle(self, call_id: str, tape: Tape) -> None:
        self._calls[call_id] = (tape, tape.length)
        self._ends[id(tape)] = call_id

    def learn_entry(self, entry: TokenEntry) -> None:
        """Learn the ids of an entry (a full prompt, or a delta after a known parent)."""
        parent = entry.parent_call_id
        if entry.prompt_is_delta:
            if parent is not None and (held := self._calls.get(parent)) is not None:
                parts = (entry.prompt_token_ids, entry.generation_token_ids)
                self._extend(entry.model_call_id, parent, held[1], parts)
            return
        prompt = entry.prompt_token_ids
        known = self._calls.get(parent) if parent is not None else None
        if known is not None and 0 < known[1] <= len(prompt):
            cumulative = known[0].view(known[1])
            if same_ids(prompt[: known[1]], cumulative):  # share the parent's tape
                parts = (prompt[known[1] :], entry.generation_token_ids)
                self._extend(entry.model_call_id, parent or "", known[1], parts)
                return
        tape = Tape(prompt)
        tape.append(entry.generation_token_ids)
        self._settle(entry.model_call_id, tape)

    def learn_later(self, entry: TokenEntry) -> None:
        """Note a plain entry a reader parsed, learnt only if a later record refers to it
        (a capture of plain lines alone costs nothing more than its parse)."""
        self._plain.append(entry)

    def learn(self, stored: bytes, entry: TokenEntry | None = None) -> None:
        """Learn the ids of a value just stored (`entry`: its parsed form, if at hand)."""
        if is_packed(stored):
            self._learn_record(_parse(stored))
        elif entry is not None:
            self.learn_entry(entry)
        else:
            self._plain.append(stored)

    def _learn_record(self, record: _Record) -> Ids:
        """Learn a record's ids; its whole prompt."""
        prompt = record.prompt
        if record.mode == REF:
            cumulative = self.get(record.base)
            if cumulative is None or len(cumulative) < record.prefix:
                raise _unknown_base(record)
            self._extend(record.call_id, record.base, record.prefix, (prompt, record.generation))
            tape = self._calls[record.call_id][0]
            return tape.view(record.prefix + len(record.prompt))
        if record.mode == DELTA:
            if self.get(record.base) is not None:
                end = self._calls[record.base][1]
                self._extend(record.call_id, record.base, end, (prompt, record.generation))
            return prompt
        tape = Tape(prompt)
        tape.append(record.generation)
        self._settle(record.call_id, tape)
        return prompt

    def render(self, stored: bytes) -> bytes:
        """The canonical line of one stored value of this rollout, learning nothing."""
        if not is_packed(stored):
            return stored
        record = _parse(stored)
        prompt = record.prompt
        if record.mode == REF:
            cumulative = self.get(record.base)
            if cumulative is None or len(cumulative) < record.prefix:
                raise _unknown_base(record)
            prompt = join_ids((cumulative[: record.prefix], prompt))
        return _text(record, prompt)

    def expand(self, stored: bytes) -> bytes:
        """The canonical line of a stored value, learning its call's ids."""
        if not is_packed(stored):
            self._plain.append(stored)
            return stored
        record = _parse(stored)
        return _text(record, self._learn_record(record))

    def read(self, record: bytes) -> StoredParts:
        """A packed record's parts as a reader needs them, learning its call's ids: what
        its canonical line holds, without writing the line (O(its own ids), the prefix of
        a reference shared with its base; docs/store-protocol.md#compact-freeze)."""
        parsed = _parse(record)
        prompt = self._learn_record(parsed)
        if prompt.dtype != NARROW:
            # A tape widens for good once an id needs 64 bits; a line's prompt is u64
            # only when it holds such an id (core/token_ids.py).
            prompt = narrowest(prompt)
        if prompt.flags.writeable:
            prompt = prompt.view()
            prompt.flags.writeable = False  # as a parsed line's prompt: a read-only view
        first, second, third, last = parsed.pieces
        skeleton = b"[]".join((first, second, third, last))
        return StoredParts(skeleton, prompt, parsed.generation, parsed.log_probs)


def _unknown_base(record: _Record) -> CaptureCorrupt:
    return CaptureCorrupt(
        f"model call {record.call_id} refers to the ids of call {record.base}, "
        "which are not stored before it"
    )


def _text(record: _Record, prompt: Ids) -> bytes:
    """A record's canonical line, its whole prompt given."""
    stdlib = bool(record.flags & _STDLIB_FLOATS)
    first, second, third, last = record.pieces
    return b"".join(
        (
            first,
            _log_probs_text(record.log_probs, stdlib),
            second,
            _ids_text(record.generation),
            third,
            _ids_text(prompt),
            last,
        )
    )


def expand_lines(stored: Iterable[bytes]) -> tuple[bytes, ...]:
    """The canonical lines of one rollout's stored values, in put order."""
    known = RolloutIds()
    return tuple(known.expand(value) for value in stored)


def stored_value(
    payload: Mapping[str, Any], line: bytes, digest: str, parsed: TokenEntry, known: RolloutIds
) -> tuple[bytes, str | None]:
    """What a store keeps for a new entry (its packed record, or its line), learnt by
    `known` (the rollout's ids, as far as this store knows them), and the call whose ids
    it refers to (None: none)."""
    packed = pack(payload, line, digest, parsed, known)
    value = line if packed is None else packed.record
    known.learn(value, parsed)
    return value, None if packed is None else packed.base
