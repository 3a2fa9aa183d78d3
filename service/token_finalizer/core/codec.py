"""The one JSON and zstd codec of the server side.

Captures and answers are mostly token ids. Parsed the ordinary way, a long
rollout's JSON becomes millions of Python ints that are copied into numpy
arrays afterwards, which costs more than everything else a read does. So the
token arrays are cut out of the text, parsed by numpy, and put back after the
(now small) JSON parse; anything unexpected falls back to the ordinary parse,
so the result never depends on the shortcut. Encoding goes through orjson
with numpy arrays serialized in place. See docs/architecture.md#codec.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import orjson
import zstandard

from token_finalizer._constants import ZSTD_LEVEL, ZSTD_STREAM_INPUT_BYTES, ZSTD_WINDOW_LOG
from token_finalizer.core.address_space import check_parse_room
from token_finalizer.core.token_ids import NARROW, WIDE, narrowest

__all__ = [
    "CodecError",
    "Piece",
    "PromptReuse",
    "dumps_entry_line",
    "encode_json",
    "has_long_digit_run",
    "ids_from_text",
    "json_depth",
    "json_type_name",
    "loads_exact_json",
    "loads_json",
    "loads_strict_json",
    "loads_with_token_arrays",
    "zstd_compress",
    "zstd_decompress",
]

# One piece of an encoded body: bytes, or a view into a larger encoding that
# is spliced into the body without being copied out first.
Piece = bytes | memoryview

# numpy's text parser saturates an id of 2**64 or more to this value: seeing it
# sends the text to the exact parse, which reports the id.
_SATURATED = int(np.iinfo(np.uint64).max)
_EMPTY_IDS = np.empty(0, dtype=NARROW)
_ID_BYTES = b"0123456789,"
_PROMPT_KEY = b'"prompt_token_ids":['
_LIFTED_KEYS = (_PROMPT_KEY, b'"generation_token_ids":[')
_COMMA_BYTE = ord(",")
_LIFTED_NAMES = frozenset({"prompt_token_ids", "generation_token_ids"})
# A string no real token field holds; the index after it says which array it stands for.
_PLACEHOLDER = "\u0000lifted:"


class CodecError(ValueError):
    """A body that cannot be decoded (bad zstd, over the size limit)."""


def loads_json(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON with orjson, falling back to the stdlib for NaN/Infinity.

    Capture lines written by Python's json module may carry `-Infinity` log
    probabilities, which orjson rejects. ParseRoomError (a MemoryError) for a
    document the address space left cannot parse (`address_space`).
    """
    check_parse_room(len(data))
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "recursion" in str(exc):
            raise ValueError(f"JSON nested too deeply: {exc}") from None
        if isinstance(data, memoryview):
            data = data.tobytes()
        try:
            return json.loads(data)
        except RecursionError:
            raise ValueError("JSON nested too deeply") from None


def loads_strict_json(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse standard JSON only (no NaN/Infinity); ValueError naming the problem."""
    check_parse_room(len(data))
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(str(exc)) from None


def _as_list(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encode_json(payload: Any) -> bytes:
    """Compact JSON with numpy arrays serialized in place (no Python int lists).

    orjson refuses integers beyond 64 bits, which a record may carry (a reward
    of 2**64 + 1): those payloads go through the stdlib, which writes them
    exactly, so nothing in a record changes on its way through.
    """
    try:
        return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as exc:
        if "64-bit" not in str(exc):
            raise
        return json.dumps(
            payload, separators=(",", ":"), ensure_ascii=False, default=_as_list
        ).encode()


def dumps_entry_line(data: Mapping[str, Any]) -> bytes:
    """Compact, sorted-key JSON of one entry (no newline), as the file store writes it.

    Non-finite log probabilities go through the stdlib, which writes
    `-Infinity`; orjson would silently turn them into null.
    """
    log_probs = data.get("generation_log_probs")
    if isinstance(log_probs, list) and not all(map(math.isfinite, log_probs)):
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return orjson.dumps(data, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)


def ids_from_text(segment: bytes) -> np.ndarray | None:
    """Parse `1,2,3` straight into ids without Python ints; None when unsure.

    The array follows the core's dtype rule (core/token_ids.py): int32 when
    every id fits, else uint64 (the whole valid range [0, 2**64)).
    """
    if not segment:
        return _EMPTY_IDS
    if segment.translate(None, _ID_BYTES):  # signs, dots, spaces...: leave it to the slow path
        return None
    try:
        ids = np.fromstring(segment, dtype=np.uint64, sep=",")
    except ValueError:
        return None
    if len(ids) != segment.count(b",") + 1 or int(ids.max()) == _SATURATED:
        return None  # an empty element or a maybe overflowing id: the slow path reports it
    return narrowest(ids)


def _restore(data: Any, arrays: list[np.ndarray]) -> bool:
    """Put each lifted array back on its placeholder; False when any is not where expected.

    Token arrays are expected on the top-level object (one entry) or on the
    objects of its `entries` list (a snapshot); each placeholder exactly once.
    """
    holders: list[Any] = [data]
    if isinstance(data, dict) and isinstance(data.get("entries"), list):
        holders.extend(data["entries"])
    used = [False] * len(arrays)
    for holder in holders:
        if not isinstance(holder, dict):
            continue
        for name in _LIFTED_NAMES:
            value = holder.get(name)
            if not (isinstance(value, str) and value.startswith(_PLACEHOLDER)):
                continue
            try:
                index = int(value[len(_PLACEHOLDER) :])
            except ValueError:
                return False
            if not 0 <= index < len(arrays) or used[index]:
                return False
            holder[name] = arrays[index]
            used[index] = True
    return all(used)


class PromptReuse:
    """Parses a prompt that extends the one before it by parsing only its new tail.

    An agent's capture stores each call's whole context as its prompt, so a
    100-call rollout spells its first tokens 100 times. When a prompt's text
    starts with the previous prompt's text (plus a comma), only the tail is
    parsed, appended to one growing buffer, and the prompt is a view of that
    buffer: parsing costs O(final context) instead of O(calls x context), and
    so does memory. Any other prompt is parsed whole and starts a new buffer.
    Text equality is exact token equality: the digits are compared byte for byte.
    """

    __slots__ = ("_buffer", "_length", "_text")

    def __init__(self) -> None:
        self._text: bytes | memoryview = b""
        self._buffer = _EMPTY_IDS
        self._length = 0

    def parse(self, segment: bytes) -> np.ndarray | None:
        """The ids of one prompt's text (`1,2,3`); None when the text is not plain ids."""
        return self.parse_at(segment, 0, len(segment))

    def parse_at(self, content: bytes, begin: int, end: int) -> np.ndarray | None:
        """`parse(content[begin:end])` without copying the text out of `content`.

        A prompt's text is compared with the previous one in place, so a
        capture's lines are never copied per prompt (each repeats the whole
        context before it).
        """
        previous = self._text
        known = len(previous)
        if previous and content.startswith(previous, begin, end):
            if end - begin == known:
                pass  # the same prompt again
            elif content[begin + known] == _COMMA_BYTE:
                tail = ids_from_text(content[begin + known + 1 : end])
                if tail is None:
                    return None
                self._append(tail)
            else:
                return self._restart(content[begin:end], content, begin, end)
        else:
            return self._restart(content[begin:end], content, begin, end)
        self._text = memoryview(content)[begin:end]
        return self._view()

    def _restart(self, segment: bytes, content: bytes, begin: int, end: int) -> np.ndarray | None:
        """A prompt that does not extend the previous one: a new buffer of its own."""
        ids = ids_from_text(segment)
        if ids is None:
            return None
        self._buffer, self._length = _EMPTY_IDS, 0
        self._append(ids)
        self._text = memoryview(content)[begin:end]
        return self._view()

    def _view(self) -> np.ndarray:
        view = self._buffer[: self._length]
        view.flags.writeable = False
        return view

    def _append(self, ids: np.ndarray) -> None:
        end = self._length + len(ids)
        # An id of 2**31 or more widens the buffer to uint64 (never a mix of dtypes
        # in one buffer: numpy would turn int32 + uint64 into floats).
        dtype = WIDE if WIDE in (ids.dtype, self._buffer.dtype) else NARROW
        if end > len(self._buffer) or dtype != self._buffer.dtype:
            grown = np.empty(max(end, 2 * len(self._buffer), 1024), dtype=dtype)
            grown[: self._length] = self._buffer[: self._length]
            self._buffer = grown  # views handed out earlier keep the old buffer alive
        self._buffer[self._length : end] = ids
        self._length = end


def _key_positions(content: bytes) -> list[tuple[int, bytes]]:
    """Where each token key occurs, in text order.

    Keys start with a quote, and token arrays hold none: hopping from quote
    to quote (memchr speed) skips each long array in one step. A plain
    `find` of the key would not: its digits defeat the substring search's
    skip table, and it crawls through every array byte by byte.
    """
    positions = []
    at = content.find(b'"')
    while at >= 0:
        for key in _LIFTED_KEYS:
            if content.startswith(key, at):
                positions.append((at, key))
                break
        at = content.find(b'"', at + 1)
    return positions


def loads_with_token_arrays(content: bytes, *, prompts: PromptReuse | None = None) -> Any:
    """`loads_json` of an entry or a snapshot, its token id arrays parsed by numpy.

    Pass one `PromptReuse` across the entries of one capture (in put order) to
    parse each prompt by its new tail only.
    """
    pieces: list[bytes] = []
    arrays: list[np.ndarray] = []
    # A token array left to the ordinary parse may hold an id orjson cannot
    # keep exact (2**64 or more): then that parse is the exact one.
    loads: Callable[[bytes], Any] = loads_json
    cursor = 0
    for start, key in _key_positions(content):
        begin = start + len(key)
        if begin <= cursor:
            continue
        end = content.find(b"]", begin)
        if end < 0:
            ids = None
        elif prompts is not None and key == _PROMPT_KEY:
            ids = prompts.parse_at(content, begin, end)
        else:
            ids = ids_from_text(content[begin:end])
        if ids is None:  # not a plain list of ids: the ordinary parse handles it
            loads = _loads_exact_allowing_non_finite
            continue
        pieces += (content[cursor : begin - 1], orjson.dumps(f"{_PLACEHOLDER}{len(arrays)}"))
        arrays.append(ids)
        cursor = end + 1
    if not arrays:
        return _loads_exact_allowing_non_finite(content)
    pieces.append(content[cursor:])
    data = loads(b"".join(pieces))
    return data if _restore(data, arrays) else loads(content)


def _loads_exact_allowing_non_finite(data: bytes) -> Any:
    return loads_exact_json(data, allow_non_finite=True)


def zstd_compress(pieces: Sequence[Piece]) -> bytes:
    """One zstd frame of the pieces in order, recording its content size.

    The size in the header lets one-shot decoders allocate once; a fresh
    compressor per call, since compressors are not thread-safe.
    """
    size = sum(len(piece) for piece in pieces)
    params = zstandard.ZstdCompressionParameters.from_level(
        ZSTD_LEVEL, window_log=ZSTD_WINDOW_LOG, source_size=size
    )
    stream = zstandard.ZstdCompressor(compression_params=params).compressobj(size=size)
    return b"".join([*(stream.compress(piece) for piece in pieces), stream.flush()])


def zstd_decompress(raw: bytes, *, limit: int) -> bytes:
    """Decode a zstd body of at most `limit` bytes once decoded; CodecError otherwise.

    A frame that announces its size is decoded in one shot into a buffer of
    that size (several times faster than streaming), after checking the size
    against `limit`. Anything else (several frames, no announced size) is
    streamed in bounded reads and abandoned as soon as it passes `limit`: a
    hostile peer's small bomb never expands in memory beyond the limit.
    """
    decompressor = zstandard.ZstdDecompressor()
    try:
        size = zstandard.frame_content_size(raw)
        if size > limit:
            raise CodecError(f"the zstd body announces {size} bytes, over the {limit} limit")
        if size >= 0:
            try:
                return decompressor.decompress(raw, allow_extra_data=False)
            except zstandard.ZstdError:
                pass  # more than one frame: stream it
        parts: list[bytes] = []
        total = 0
        rest = bytes(raw)
        while rest:  # one frame per pass
            frame = decompressor.decompressobj()
            used = 0
            while not frame.eof and used < len(rest):
                # Small input steps bound what one step can expand to (a zstd block
                # of a few bytes may stand for 128 KiB), so the limit is checked
                # long before a bomb fills memory.
                part = frame.decompress(rest[used : used + ZSTD_STREAM_INPUT_BYTES])
                used += ZSTD_STREAM_INPUT_BYTES
                total += len(part)
                if total > limit:
                    raise CodecError(f"the zstd body decodes to more than {limit} bytes")
                parts.append(part)
            if not frame.eof:
                raise CodecError("the zstd body is truncated")
            rest = frame.unused_data + rest[used:]
        return b"".join(parts)
    except zstandard.ZstdError as exc:
        raise CodecError(f"the zstd body does not decode: {exc}") from None


_QUOTE, _BACKSLASH = ord('"'), ord("\\")


def _escaped(text: np.ndarray, quote: int) -> bool:
    """Whether the quote at `quote` follows an odd run of backslashes."""
    run = 0
    while quote - run - 1 >= 0 and text[quote - run - 1] == _BACKSLASH:
        run += 1
    return run % 2 == 1


def json_depth(data: bytes | bytearray) -> int:
    """How deeply containers nest in a JSON text, found without parsing it.

    Only the structural characters (quotes and brackets) are looked at, with
    numpy: a body of token ids is mostly digits and commas, so that is a small
    set. Quotes after an odd run of backslashes are not string ends; brackets
    between a string's quotes do not count. The result is only meaningful for
    valid JSON (it is used before parsing, to refuse bombs).
    """
    text = np.frombuffer(data, dtype=np.uint8)
    structural = np.flatnonzero(
        (text == _QUOTE)
        | (text == ord("["))
        | (text == ord("]"))
        | (text == ord("{"))
        | (text == ord("}"))
    )
    if not len(structural):
        return 0
    chars = text[structural]
    quotes = chars == _QUOTE
    preceded = structural[quotes & (structural > 0)]
    for position in preceded[text[preceded - 1] == _BACKSLASH].tolist():
        if _escaped(text, position):
            quotes[np.searchsorted(structural, position)] = False
    seen_quotes = np.cumsum(quotes)
    outside = (seen_quotes % 2 == 0) & ~quotes
    step = np.zeros(len(chars), dtype=np.int32)
    step[outside & ((chars == ord("[")) | (chars == ord("{")))] = 1
    step[outside & ((chars == ord("]")) | (chars == ord("}")))] = -1
    return int(np.cumsum(step).max(initial=0))


# orjson reads an integer outside [-2**63, 2**64) as a float, silently. Such a
# number has at least 19 digits; a text holding a run that long is parsed by
# the stdlib, which keeps every integer exact (docs/finalizer-api.md#limits).
_WIDE_INTEGER_DIGITS = 19


def has_long_digit_run(data: bytes | bytearray) -> bool:
    """Whether the text holds an integer of 19 or more digits (one orjson may not hold).

    Runs are found by doubling: `runs[i]` says whether a run of the current
    length starts at i, and two overlapping runs make a longer one, so five
    vectorized ANDs answer for length 19 without looking at each number. Only
    the few places where 19 digits start are then looked at one by one: a run
    right after a decimal point is a fraction (a log probability of
    -0.000123456789012345678, Python's repr of a float near zero), and one
    right after a letter is inside a string (a hex digest holds 19 decimal
    digits in a row now and then) or an exponent: none of them is an integer,
    so none sends a body to the slow parse. A run right after another digit
    lies inside a longer run, judged at that run's start.
    """
    text = np.frombuffer(data, dtype=np.uint8)
    digits = (text >= ord("0")) & (text <= ord("9"))
    runs = digits
    for shift in (1, 2, 4, 8):  # lengths 2, 4, 8, 16
        runs = runs[:-shift] & runs[shift:]
        if not runs.any():
            return False
    starts = np.flatnonzero(runs[:-3] & runs[3:])  # 16 and 16 three apart = 19
    if not starts.size:
        return False
    before = text[np.maximum(starts - 1, 0)]
    folded = before | 0x20  # ASCII letters to lower case; '.' and the digits stay
    not_integer = (
        digits[np.maximum(starts - 1, 0)]
        | (before == ord("."))
        | ((folded >= ord("a")) & (folded <= ord("z")))
    )
    return bool(((starts == 0) | ~not_integer).any())


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads_exact_json(data: bytes | bytearray, *, allow_non_finite: bool = False) -> Any:
    """Parse JSON keeping every integer exact, at orjson speed when no integer is wide."""
    if not has_long_digit_run(data):
        return loads_json(data) if allow_non_finite else loads_strict_json(data)
    try:
        if allow_non_finite:
            return json.loads(data)
        return json.loads(data, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def lone_surrogate_at(value: Any, where: str = "body") -> str | None:
    """The path (`body.rows[2].reason`) of the first string or key holding a lone surrogate.

    orjson refuses such strings (they cannot be encoded as UTF-8), the stdlib
    parser does not: a value accepted this way could never be answered again.
    Walked without recursion.
    """
    pending: list[tuple[str, Any]] = [(where, value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, str):
            if not _encodes(item):
                return path
        elif isinstance(item, dict):
            for key, inner in item.items():
                if not _encodes(key):
                    return f"{path} (a key)"
                pending.append((f"{path}.{key}", inner))
        elif isinstance(item, list):
            pending.extend((f"{path}[{index}]", inner) for index, inner in enumerate(item))
    return None


def with_encodable_text(value: Any) -> Any:
    """`value` with each lone surrogate of its strings and keys spelled `\\ud800`.

    For answers only, never for what is stored: a capture written before such
    strings were refused still yields an answer (a masked record naming the
    reason), never a 500 on every retry (issue 29).
    """
    if isinstance(value, str):
        return value if _encodes(value) else value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, dict):
        return {with_encodable_text(key): with_encodable_text(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [with_encodable_text(item) for item in value]
    return value


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def json_type_name(value: Any) -> str:
    """The JSON name of a parsed value's type: object, array, string, boolean, null, number."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    return "null" if value is None else "number"
