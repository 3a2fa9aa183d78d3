"""Tunables of the client package.

Plain values only, no httpx: `token_finalizer_client.protocol` reads the id
limit from here and must stay importable without any HTTP library.
"""

from __future__ import annotations

# Finalizer clients: seconds a call may take, and seconds to connect (a
# connect that takes long means the server is gone).
DEFAULT_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 5.0
# Capture-store connections (sink, resolver): seconds a try may take; a put
# may wait for the store's fsync.
DEFAULT_STORE_TIMEOUT_S = 10.0
DEFAULT_MAX_RETRIES = 2
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_MAX_KEEPALIVE = 32
# A model server makes one resolve, one begin_call and one put per model call,
# with 64 to 256 calls in flight per process: a pool this large keeps each of
# them on a warm connection instead of paying a TCP connect per call.
DEFAULT_STORE_MAX_CONNECTIONS = 256
DEFAULT_STORE_MAX_KEEPALIVE = 256
# Seconds a pooled store connection may stay idle: under any uvicorn server's idle
# timeout (its `timeout_keep_alive`, 5 s by default; our servers keep 20 s), so the
# pool drops a connection before the server closes it. With both at 5 s a request could be sent on a
# connection the server was closing that moment: a ReadError, and a retry
# that costs the call a retry wait (docs/architecture.md#round-trips).
STORE_KEEPALIVE_EXPIRY_S = 4.0
# Largest answer each client reads, once decoded (docs/architecture.md#bounded-answers):
# a compressed body is small on the wire whatever it expands to. A finalize
# answer repeats the record it was sent (at most the service's 64 MiB body
# limit) and, in the compact token form, adds the context once (a 1M-token
# rollout: under 20 MB); a store answer carries one cumulative sequence.
DEFAULT_MAX_ANSWER_BYTES = 256 * 1024 * 1024
DEFAULT_STORE_MAX_ANSWER_BYTES = 64 * 1024 * 1024
# A staging source's fetch answers every snapshot of a rollout at once (a
# 400-call rollout of 4,000-token calls with log probabilities: ~50 MB).
DEFAULT_STAGED_FETCH_MAX_ANSWER_BYTES = 256 * 1024 * 1024
# An error answer is read up to this size only: its message is all it carries.
MAX_ERROR_BODY_BYTES = 64 * 1024
# A server's error message and a resolution's reason are kept this long at most.
MAX_MESSAGE_CHARS = 1000
MAX_REASON_CHARS = 200
# Bounded decoding: output is produced (and counted) in steps of at most this
# many bytes, and a body of more zstd frames or gzip members than this is refused.
DECODE_STEP_BYTES = 256 * 1024
MAX_ENCODED_PARTS = 1024
RETRY_BASE_DELAY_S = 0.25
RETRY_MAX_DELAY_S = 4.0
# Each retry is logged as one warning on this logger (the library adds no
# handler: the application decides where it goes); the record's fields
# (method, path, attempt, wait, error) are a dict in this attribute, which the
# service's JSON log lines merge as keys (docs/configuration.md#logs).
LOGGER_NAME = "token_finalizer_client"
LOG_FIELDS_ATTRIBUTE = "json_fields"
# Only these statuses mean "the server is momentarily unable": repeat the call.
RETRY_STATUSES = frozenset({502, 503, 504})
RUN_ID_HEADER = "X-Run-Id"
# Asked for on every call: large finalize answers shrink ~100x under zstd.
ACCEPT_ENCODING = "zstd, gzip"
# Query parameter of every finalize and every lineage resolve: each prompt as a
# prefix length of one `context_token_ids` (finalize), the match's cumulative
# ids as one base64 string of little-endian integers (resolve), so an answer
# grows with the context, not calls x context, and costs no per-token parsing.
COMPACT_TOKENS = ("tokens", "compact")
# The resolver keeps each rollout's last match (its cumulative ids) and names it
# in the next resolve, so the store answers only the ids after it
# (docs/store-protocol.md#known-prefix). At most this many ids are kept, over
# all rollouts (least recently resolved dropped first): a tuple costs 8 bytes
# per id beyond the ints, which the model server holds for its own prompts.
RESOLVER_KNOWN_IDS_BUDGET = 4_000_000
# The cumulative ids of calls an HttpTokenSink put itself, kept (LRU, over all rollouts)
# to send the next call's prompt as its parent's prefix + suffix (docs/store-protocol.md#delta-put).
SINK_SENT_IDS_BUDGET = 4_000_000

# A store's advertised features (GET /capabilities) are kept this long, then asked
# again on next use, so a store upgraded in place is used without a new client
# (docs/store-protocol.md#extensions-and-capabilities).
CAPABILITIES_TTL_S = 300.0
# finalize_many: calls in flight by default, and how far past the oldest
# unfinished record it may start (a multiple of the concurrency), which bounds
# the answers held back waiting for a slow one.
DEFAULT_CONCURRENCY = 8
REORDER_WINDOW_FACTOR = 4
USER_AGENT = "token-finalizer-client"
# A JSON attachment of a staged call nests at most this many containers
# deep; deeper ones are refused before anything is sent (docs/staging.md#the-client).
MAX_ATTACHMENT_DEPTH = 128
# Longest rollout or model call id a store accepts: ids become file names
# (plus a suffix of at most 25 characters) and Redis keys (docs/records-and-builds.md).
MAX_ID_LENGTH = 200
