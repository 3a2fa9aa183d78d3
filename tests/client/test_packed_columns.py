"""A staged call's token columns packed as big-endian binary images, or left as lists."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest

from token_finalizer_client._packed_columns import pack_columns

IDS, MASK, LOG_PROBS = [1, 2**64 - 1, 0], [0.0, 1.0, 1.0], [0.0, -0.5, -1e-300]


def test_columns_pack_as_big_endian_images() -> None:
    """Ids are >u8 and floats >f8, each in standard base64."""
    packed = pack_columns(IDS, MASK, LOG_PROBS)
    assert packed == {
        "token_ids_delta": base64.b64encode(struct.pack(">3Q", *IDS)).decode(),
        "token_mask_delta": base64.b64encode(struct.pack(">3d", *MASK)).decode(),
        "generation_log_probs_delta": base64.b64encode(struct.pack(">3d", *LOG_PROBS)).decode(),
    }


@pytest.mark.parametrize(
    ("ids", "mask", "log_probs"),
    [
        ([], [], []),
        ([1, True, 3], MASK, LOG_PROBS),
        ([-1, 2, 3], MASK, LOG_PROBS),
        ([2**64, 2, 3], MASK, LOG_PROBS),
        (IDS, [0, 1.0, 1.0], LOG_PROBS),
        (IDS, MASK, [0.0, -0.5, "x"]),
        (IDS, MASK, None),
    ],
    ids=["empty", "bool id", "negative id", "id past 2**64", "int mask", "string", "missing"],
)
def test_a_column_that_does_not_pack_exactly_leaves_lists(
    ids: Any, mask: Any, log_probs: Any
) -> None:
    """Anything but exact ints in range and exact floats is not packed: the store judges it."""
    assert pack_columns(ids, mask, log_probs) is None
