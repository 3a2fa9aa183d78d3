"""Every tunable of the service in one place.

Values that are part of the wire or on-disk contract (key names, file suffixes)
live next to the code that owns them; this module holds the numbers an operator
might reasonably want to change.
"""

from __future__ import annotations

# TokenEntry records newer than this are refused: a newer schema may change what
# a token field means, and guessing would train on wrong data.
TOKEN_ENTRY_SCHEMA_VERSION = 1

# Rounding of the fractions reported in build metrics.
FRACTION_DIGITS = 4

# Default capture directory of the embedded `local` file source.
DEFAULT_CAPTURE_DIR = "./capture"
DEFAULT_SOURCE_NAME = "local"

# HTTP service defaults.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_STORE_PORT = 8100
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_MASK_FRACTION_MIN_SAMPLES = 50
DEFAULT_RUN_ID = "default"

# Remote capture store (http source) defaults.
DEFAULT_HTTP_TIMEOUT_S = 10.0
HTTP_MAX_CONNECTIONS = 32
HTTP_MAX_KEEPALIVE = 16
HTTP_MAX_RETRIES = 3
HTTP_RETRY_BASE_DELAY_S = 0.1
HTTP_RETRY_MAX_DELAY_S = 2.0
HTTP_RETRY_STATUSES = frozenset({502, 503, 504})

# zstd level for large JSON answers: level 3 shrinks a prefix-heavy snapshot to
# about 1% in tens of milliseconds; higher levels cost far more for little gain.
ZSTD_LEVEL = 3
# Below this size compression costs more than it saves on loopback and LANs.
ZSTD_MIN_BYTES = 1024

# Modulus and base of the polynomial prefix hash the builder uses to find parent
# candidates. Any hit is verified token by token, so a collision only costs time.
PREFIX_HASH_MODULUS = 2_147_483_647  # 2**31 - 1, so products fit in int64
PREFIX_HASH_BASE = 1_000_003

# Builds of snapshots with at least this many tokens run in a worker thread so
# the event loop keeps serving other requests meanwhile.
BUILD_IN_THREAD_MIN_TOKENS = 200_000
