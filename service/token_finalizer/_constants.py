"""Every tunable of the service in one place.

Values that are part of the wire or on-disk contract (key names, file suffixes)
live next to the code that owns them; this module holds the numbers an operator
might reasonably want to change.
"""

from __future__ import annotations

import os
from typing import Final

# Configuration files: deepest nesting and most values (aliases expanded) accepted.
# A real configuration is a few levels deep and holds a few hundred values.
CONFIG_MAX_DEPTH = 64
CONFIG_MAX_VALUES = 100_000
# Longest duration a setting accepts, in seconds (ten years): a larger one
# would overflow a socket timeout or a Redis expiry when the service uses it.
MAX_SETTING_SECONDS = 10 * 365 * 24 * 3600
# A retire key must hold at least this many bytes: a short one is recovered
# offline from a single genuine ticket.
MIN_RETIRE_KEY_BYTES = 32

# TokenEntry records newer than this are refused: a newer schema may change what
# a token field means, and guessing would train on wrong data.
TOKEN_ENTRY_SCHEMA_VERSION = 1
# ... and older than this too: NeMo Gym 0.7 refuses them (no writer ever produced one).
TOKEN_ENTRY_MIN_SCHEMA_VERSION = 1

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
# Threshold of the service's and the client's log lines unless
# TOKEN_FINALIZER_LOG_LEVEL says otherwise (retries are warnings).
DEFAULT_LOG_LEVEL = "info"

# A retired tombstone (and its version) is kept this long by default: it only
# has to outlive the attempt's straggling writers (redis sources, store serve).
DEFAULT_RETIRED_TTL_S = 7 * 86_400.0
# What a source that cannot be reached does by default: answer 503 so the
# harness retries (nothing was frozen), rather than mask the record.
DEFAULT_ON_UNREACHABLE: Final = "retry"

# The mask-fraction guard shared through Redis (guard.redis): the prefix of its
# keys, how long a run's counts live after its last counted finalize, and how
# long one Redis command may take before the finalize goes on unguarded.
DEFAULT_GUARD_KEY_PREFIX = "token-finalizer:guard:"
DEFAULT_GUARD_RUN_TTL_S = 7 * 86_400.0
DEFAULT_GUARD_TIMEOUT_S = 1.0

# Remote capture store (http source) defaults.
DEFAULT_HTTP_TIMEOUT_S = 10.0
HTTP_MAX_CONNECTIONS = 32
HTTP_MAX_KEEPALIVE = 16
HTTP_MAX_RETRIES = 3
HTTP_RETRY_BASE_DELAY_S = 0.1
HTTP_RETRY_MAX_DELAY_S = 2.0
# Which failures are retried is not tuned here: it is the one retry policy's
# (token_finalizer_client.transport), shared with the client.

# zstd for JSON answers (snapshots, finalize answers). A snapshot repeats every
# prompt prefix, so even fast levels shrink it ~50x. Measured on the 5M-token
# finalize answer (64 MB of JSON): level 2 with a 4 MiB window compresses in
# 26 ms to 1.09 MB, level 3 takes 47 ms for 1.20 MB. The window stays under the
# 8 MiB an HTTP zstd decoder may insist on (RFC 9659).
ZSTD_LEVEL = 2
ZSTD_WINDOW_LOG = 22
# zstd bodies that do not announce their size are fed to the decoder this many
# compressed bytes at a time, so the size limit is checked every few MB of output.
ZSTD_STREAM_INPUT_BYTES = 1024
# gzip and deflate bodies are decoded at most this many bytes of output a step,
# so a bomb is refused a step after it passes the size limit.
INFLATE_STEP_BYTES = 1024 * 1024
# Below this size compression costs more than it saves on loopback and LANs.
ZSTD_MIN_BYTES = 1024
# Uncompressed answers of at least this size are streamed in chunks of the
# second size, so sending one never holds the event loop for a large copy.
STREAM_MIN_BYTES = 4 * 1024 * 1024
STREAM_CHUNK_BYTES = 1024 * 1024

# Builds of snapshots with at least this many tokens run in a worker thread so
# the event loop keeps serving other requests meanwhile.
BUILD_IN_THREAD_MIN_TOKENS = 200_000
# A build's token digests (each call's cumulative sequence: ~640 MB of SHA-256
# for a 400-call, 400k-token rollout) are hashed by this many threads once a
# batch holds at least the second size; hashlib releases the GIL while it
# hashes a large buffer. More threads than cores gain nothing.
DIGEST_THREADS = min(4, os.cpu_count() or 1)
DIGEST_PARALLEL_MIN_BYTES = 4 * 1024 * 1024

# ---------------------------------------------------------------------------
# Finalizer HTTP service (token_finalizer.api)
# ---------------------------------------------------------------------------

# Request bodies (records, entries) may nest containers this deep. The JSON
# encoder stops at 254 levels, and answers wrap records in a few more.
MAX_JSON_DEPTH = 128
# Snapshot versions are counters; anything above this is not one (and 2**53 stays
# exact in every JSON reader).
MAX_SNAPSHOT_VERSION = 2**53
# Seconds a 503 (a capture store out of reach) asks clients to wait before retrying.
RETRY_AFTER_S = 2
# Runs the mask-fraction guard remembers; the least recently seen is forgotten
# first, so a service fed endless distinct run ids keeps bounded memory.
GUARD_MAX_RUNS = 10_000
# /ready gives each source this long to answer its ping before calling it down.
READY_PING_TIMEOUT_S = 2.0
# The store server's /health gives its backend (Redis PING, the directory check)
# this long: less than READY_PING_TIMEOUT_S, so a finalizer's /ready reads the
# store's own verdict (and its error) rather than a timeout.
STORE_HEALTH_TIMEOUT_S = 1.5
# The port a redis:// URL without one means.
DEFAULT_REDIS_PORT = 6379
# Bodies of at least this size are parsed, and their answers encoded, in a
# worker thread so one large rollout does not stall every other request.
PARSE_IN_THREAD_MIN_BYTES = 1024 * 1024
# Packed entries stored in at least this many bytes are expanded into their lines in a
# worker thread (they expand to several times as much; docs/store-protocol.md#packed-at-rest).
EXPAND_IN_THREAD_MIN_BYTES = 256 * 1024
# Answers carrying at least this many token ids are encoded in a worker thread.
ENCODE_IN_THREAD_MIN_TOKENS = 200_000
# Latency histogram buckets (seconds): small rollouts take milliseconds, the
# 5M-token rollout about a second.
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# The store server's request latency (its hot path answers in about a millisecond:
# docs/architecture.md#round-trips), from half a millisecond to 5 s (a Redis failover).
STORE_LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
# Seconds uvicorn waits for in-flight requests after SIGTERM before cancelling them.
GRACEFUL_SHUTDOWN_S = 30.0
# After SIGTERM, serve on with /ready at 503 this long before closing the port.
DEFAULT_DRAIN_S = 2.0
# Finalizes that run at once in one worker process; the rest wait their turn on
# the event loop. Builds are CPU-bound Python, so more of them at once only
# fight over the GIL (measured: ~35% more CPU per finalize at 64 than at 4),
# and the bound also caps the memory of concurrent large builds.
FINALIZE_CONCURRENCY = 4

# ---------------------------------------------------------------------------
# Remote capture stores: the http source and the store server (protocol v1)
# ---------------------------------------------------------------------------

# A whole freeze through the http source (every retry, every byte) must finish
# within this many of the source's `timeout_s`.
HTTP_DEADLINE_TIMEOUTS = 3
# Freeze answers of at least this size (and every zstd one) are decoded and
# parsed in a worker thread: the 5M-token snapshot takes about 0.2 s.
HTTP_PARSE_IN_THREAD_MIN_BYTES = 1024 * 1024
# A compact freeze answer (packed records, docs/store-protocol.md#compact-freeze) is
# dense: at least this many bytes of it (about 20 calls of 500 new tokens; some 2 ms
# of reading) are read in a worker thread.
HTTP_COMPACT_PARSE_IN_THREAD_MIN_BYTES = 64 * 1024
# Largest decoded answer the http source accepts from a capture store (a zstd
# body is tiny on the wire; this bounds what it may expand to).
HTTP_MAX_ANSWER_BYTES = 1024 * 1024 * 1024
# orjson reserves up to about 12x a JSON document's size of address space while
# it parses it, and crashes the process (SIGSEGV) when it cannot get it. Under an
# address-space limit (RLIMIT_AS, `prlimit --as`), a document of at least
# JSON_PARSE_CHECK_MIN_BYTES is parsed only while this many times its size is
# still free; else it is refused with a MemoryError (an http source's freeze
# answer: a masked record). docs/configuration.md#memory-ceilings
JSON_PARSE_ADDRESS_FACTOR = 16
JSON_PARSE_CHECK_MIN_BYTES = 4 * 1024 * 1024
# A state replacement lives for milliseconds: a temporary state file (or a lone
# lock file) this old was left by a killed writer and is removed by a sweep.
FILE_STALE_AGE_S = 60.0
# Redis (the redis store, the shared guard; sources/redis/_retrying.py): every
# failure that may pass (a lost connection, MOVED/ASK/TRYAGAIN during a slot
# move, a cluster down during a failover) is retried until the operation's
# deadline (the source's timeout_s), waiting between tries with jittered
# exponential backoff between these bounds; redis-py's own retries are off.
# A connect waits at most the cap (or the deadline, when shorter).
REDIS_RETRY_BASE_S = 0.02
REDIS_RETRY_CAP_S = 0.25
REDIS_CONNECT_TIMEOUT_CAP_S = 5.0
# A client replaced after it failed in a way that says its own state is broken
# is closed this much later, once the calls still running on it are over.
REDIS_REPLACED_CLIENT_CLOSE_S = 10.0
# ... and replaced at most this often, so that an outage (when every client
# fails) does not pile up clients waiting to be closed.
REDIS_REPLACE_MIN_INTERVAL_S = 1.0
# Health pings (/ready, the store server's /health): each node gets this long,
# the whole probe (every primary of a cluster, a topology refresh, a second
# round) at most the second; both under STORE_HEALTH_TIMEOUT_S.
REDIS_PING_NODE_TIMEOUT_S = 0.5
REDIS_PING_TIMEOUT_S = 1.2
# With min_replicas_acked, WAIT follows every state change on its connection,
# after a write of this short-lived marker key under the rollout's hash tag:
# WAIT counts the connection's own writes, and a repeated call that changes
# nothing (the retry of a put that was applied) must still wait for the first.
REDIS_SYNC_MARK_TTL_MS = 1000
# `store serve --redis-timeout`: each store operation's deadline, retries included.
DEFAULT_STORE_REDIS_TIMEOUT_S = 5.0
# Seconds a store server's 503 asks writers to wait: it has already retried for
# its own deadline, and a Redis failover is over within a few seconds.
STORE_RETRY_AFTER_S = 1
# Keys asked for per SCAN round when listing rollouts.
REDIS_SCAN_COUNT = 1000
# A put whose stored payload kept changing under it (only an admin delete can
# do that) gives up after this many rounds.
REDIS_PUT_ROUNDS = 4
# Capture memory (docs/capacity.md): above this share of Redis's `maxmemory`
# every write that adds capture data is refused at once (507); freeze, drop,
# retire and sweep go on. None of it applies when `maxmemory` is 0.
DEFAULT_MEMORY_HIGH_WATER = 0.9
# A writer reads Redis's memory (`INFO memory stats`) at most this often: a
# put or begin between two readings uses the last one.
REDIS_MEMORY_CHECK_INTERVAL_S = 0.2
# Largest request body the store server reads (one TokenEntry per PUT; a
# 100k-token prompt is under 1 MB of JSON).
STORE_MAX_BODY_BYTES = 64 * 1024 * 1024
# External staging (docs/staging.md#storage). Staged calls are immutable once
# stored, so each process keeps the ones it parsed (the parents a new call's
# custody check walks) by staging digest, up to this many token ids in all,
# least recently used out first: ~24 bytes a token (ids, mask, log probs),
# so about 100 MB, a 400-call chain of 500-token deltas 200k of them.
STAGED_CACHE_MAX_TOKENS = 4_000_000
# The file store keeps each rollout's ledger and staged-call index in the
# process, read on from the last byte offset; at most this many rollouts.
STAGING_INDEX_MAX_ROLLOUTS = 4096
# A staged/fetch or staged/extras request names at most this many calls.
STAGED_FETCH_MAX_KEYS = 100_000
# Snapshots with at least this many tokens are encoded in a worker thread by
# the store server, so other writers are not stalled meanwhile ...
STORE_ENCODE_IN_THREAD_MIN_TOKENS = 200_000
# ... and answers spliced from stored lines of at least this many bytes are
# assembled and compressed there too.
STORE_ENCODE_IN_THREAD_MIN_BYTES = 1024 * 1024
# Resolve answers the store server remembers (by rollout and digest, weakly) to
# take a client's known prefix without hashing it (docs/store-protocol.md#known-prefix).
STORE_ANSWERED_IDS = 4096
# A redis put validates and serializes an entry of fewer tokens than this on the
# event loop: a worker-thread hop costs more than the work for a delta prompt.
STORE_PREPARE_IN_THREAD_MIN_TOKENS = 8192

# The lineage index (docs/store-protocol.md#lineage-index). Cumulative token ids
# of answered calls are cached per store, least recently used first out, up to
# this many tokens in all (8 bytes each at most): the next call of a rollout
# usually continues the last answer and appends only its own delta.
LINEAGE_CACHE_MAX_TOKENS = 8_000_000
# A file store keeps the index of this many rollouts in memory (the least
# recently resolved is dropped, and rebuilt from its file if asked again).
LINEAGE_INDEX_MAX_ROLLOUTS = 2048
# A redis resolve names at most this many of the rollout's cached chains to its
# script, which stops walking a delta chain at any of them.
LINEAGE_REDIS_CACHED_STOPS = 32

# glibc mmap threshold pinned by long-running commands (see _memory.py): blocks
# at least this large are mmapped and go back to the OS as soon as they are freed.
MALLOC_MMAP_THRESHOLD_BYTES = 128 * 1024
# glibc arenas per process (default: 8 per core); see _memory.py.
MALLOC_ARENA_MAX = 2

# ---------------------------------------------------------------------------
# Offline batch commands (token-finalizer finalize / retire)
# ---------------------------------------------------------------------------

# Records finalized at once by default (HTTP requests, or in-process builds).
BATCH_DEFAULT_CONCURRENCY = 8
# Read when --token is not given, so a token need not appear in `ps` output.
BATCH_TOKEN_ENV_VAR = "TOKEN_FINALIZER_TOKEN"
# A terminal progress line is redrawn at most this often.
BATCH_PROGRESS_INTERVAL_S = 0.2

# ---------------------------------------------------------------------------
# Connections and request deadlines of both HTTP servers (web/protocol.py, web/body.py)
# ---------------------------------------------------------------------------

# A connection must deliver a whole request head (request line and headers)
# within this many seconds of connecting, or of its first byte after a
# keep-alive pause (uvicorn's own `timeout_keep_alive` closes idle ones);
# otherwise it is answered 408 and closed. uvicorn has no such limit: without
# it a client sending one byte a second holds a connection and a file
# descriptor forever. $TOKEN_FINALIZER_HEADER_TIMEOUT_S overrides it.
REQUEST_HEAD_TIMEOUT_S = 10.0
HEAD_TIMEOUT_ENV_VAR = "TOKEN_FINALIZER_HEADER_TIMEOUT_S"
# A request body must arrive within this many seconds, plus one second for every
# REQUEST_BODY_MIN_BYTES_PER_S bytes received: a 64 MiB body may take 94 s, a
# body trickling one byte a second is answered 408 after 30 s.
# $TOKEN_FINALIZER_BODY_TIMEOUT_S overrides the 30 s.
REQUEST_BODY_TIMEOUT_S = 30.0
REQUEST_BODY_MIN_BYTES_PER_S = 1024 * 1024
BODY_TIMEOUT_ENV_VAR = "TOKEN_FINALIZER_BODY_TIMEOUT_S"
# Connections one server process holds open at most (uvicorn's
# `limit_concurrency`). When all are taken, a new connection displaces the one
# that has waited longest for its client (an idle keep-alive connection, or one
# still sending its request head); when every one is busy with a request, a new
# request is answered 503. 2048 covers 32 clients with the client package's
# full pool of 64 connections each.
MAX_CONNECTIONS = 2048
# Seconds an idle keep-alive connection stays open (uvicorn's `timeout_keep_alive`,
# 5 s by default). The client package drops its pooled connections after 4 s idle
# (STORE_KEEPALIVE_EXPIRY_S there); with the server at 5 s, a server whose event
# loop was busy for a second closed connections that a request had just been sent
# on (the client saw "Server disconnected" and paid a retry wait). 20 s leaves room.
SERVER_KEEPALIVE_S = 20.0
# Connections accepted in one go (the listen backlog; asyncio accepts up to this
# many before any of them is looked at). uvicorn's default.
MAX_ACCEPT_BACKLOG = 2048
# Both are lowered to fit the process's open-file limit: this many descriptors
# are kept for capture files, store connections and logs, and what is left is
# split evenly between held connections and one burst of accepted ones. A flood
# of connections then meets the cap before it meets EMFILE (when even /health
# can no longer be accepted).
CONNECTION_FD_RESERVE = 128
# The cap never goes below this, however low the open-file limit.
MIN_CONNECTIONS = 16
