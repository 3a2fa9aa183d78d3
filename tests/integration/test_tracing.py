"""One trace across processes: a harness's span continues through the store and the finalizer.

The test process is the harness: the OpenTelemetry SDK with an in-memory
exporter (its own provider, never the process's global one) starts a span,
and within it our clients write a rollout (`HttpTokenSink`,
`HttpLineageResolver`) into `token-finalizer store serve` (Redis behind it)
and finalize and retire it through `token-finalizer serve`, whose `http`
source reads that store. Both servers are subprocesses exporting over
OTLP/HTTP to a receiver on loopback (`OTEL_*` in their environment). The
spans they export must hang off the harness's span with the right parents
(docs/tracing.md#spans).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.support.captures import agent_rollout, record_for
from tests.support.otlp_receiver import ReceivedSpan, otlp_receiver
from tests.support.redis import store_backend
from tests.support.servers import free_port, running_process
from token_finalizer_client import FinalizerClient, HttpLineageResolver, HttpTokenSink
from token_finalizer_client.protocol import ROLLOUT_ROUTE as ROUTE

ROLLOUT = "traced-1"
# Every token id of the rollout is at least this: no attribute may hold one.
TOKEN_BASE = 7_300_000
_SERVER = SpanKind.SERVER.value + 1  # OTLP numbers kinds from 1 (internal) where the API has 0


@dataclass(frozen=True)
class Traced:
    """The harness's span, every span the servers exported in its trace, the token ids sent."""

    harness_trace_id: str
    harness_span_id: str
    spans: list[ReceivedSpan]
    token_ids: frozenset[int]
    exported_to: frozenset[str]  # every OTLP path the servers posted to

    def named(self, service: str, name: str) -> list[ReceivedSpan]:
        return [span for span in self.spans if (span.service, span.name) == (service, name)]

    def one(self, service: str, name: str) -> ReceivedSpan:
        (span,) = self.named(service, name)
        return span

    def by_id(self, span_id: str) -> ReceivedSpan:
        (span,) = [span for span in self.spans if span.span_id == span_id]
        return span


def _entries() -> list[dict]:
    entries = agent_rollout(ROLLOUT, calls=3, new_tokens_per_turn=40, vocab=1000)
    for entry in entries:
        for field in ("prompt_token_ids", "generation_token_ids"):
            entry[field] = [TOKEN_BASE + token for token in entry[field]]
    return entries


async def _write(store_url: str, entries: list[dict]) -> None:
    async with HttpTokenSink(url=store_url) as sink:
        for entry in entries:
            await sink.begin_call(ROLLOUT, entry["model_call_id"])
            await sink.put(entry)
    async with HttpLineageResolver(url=store_url) as resolver:
        # A request holding a model output is resolved by the store (a root one is not).
        items = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "a reply nobody captured"},
            {"role": "user", "content": "and?"},
        ]
        await resolver.resolve(ROLLOUT, items)


def _complete(trace_id: str) -> object:
    def enough(spans: list[ReceivedSpan]) -> bool:
        names = {(span.service, span.name) for span in spans if span.trace_id == trace_id}
        return {
            ("token-finalizer", "POST /retire"),
            ("token-finalizer-store", f"POST {ROUTE}/drop"),
            ("token-finalizer-store", "redis drop"),
        } <= names

    return enough


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    """The scenario, run once: its harness span and the servers' spans of its trace."""
    directory = tmp_path_factory.mktemp("tracing")
    with otlp_receiver() as receiver, contextlib.ExitStack() as stack:
        env = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            # Asks FastAPI (0.165 on) to export its own traces, metrics and logs too:
            # our apps turn its telemetry off (web/tracing.py), so it must not.
            "FASTAPI_OTEL_AUTO_CONFIGURE": "true",
            "OTEL_METRIC_EXPORT_INTERVAL": "50",
            "OTEL_BLRP_SCHEDULE_DELAY": "50",
        }
        store_port, finalizer_port = free_port(), free_port()
        backend = store_backend(stack, "redis", directory, "tracing")
        store_args = ["store", "serve", *backend, "--port", str(store_port)]
        stack.enter_context(running_process(store_args, port=store_port, env=env))
        store_url = f"http://127.0.0.1:{store_port}"
        config = directory / "finalizer.yaml"
        config.write_text(
            yaml.safe_dump({"sources": {"store": {"kind": "http", "url": store_url}}})
        )
        serve_args = ["serve", "--config", str(config), "--port", str(finalizer_port)]
        stack.enter_context(running_process(serve_args, port=finalizer_port, env=env))

        provider = TracerProvider()
        exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        entries = _entries()
        with provider.get_tracer("harness").start_as_current_span("harness") as harness:
            asyncio.run(_write(store_url, entries))
            with FinalizerClient(f"http://127.0.0.1:{finalizer_port}") as client:
                finalized = client.finalize(record_for(ROLLOUT))
                assert finalized.build is not None and not finalized.build["mask_sample"]
                assert client.retire(finalized) is True
        context = harness.get_span_context()
        trace_id, span_id = f"{context.trace_id:032x}", f"{context.span_id:016x}"
        spans = receiver.wait_for(_complete(trace_id))
        token_ids = frozenset(
            token
            for entry in entries
            for token in (*entry["prompt_token_ids"], *entry["generation_token_ids"])
        )
        in_trace = [span for span in spans if span.trace_id == trace_id]
        yield Traced(trace_id, span_id, in_trace, token_ids, frozenset(receiver.paths))


def test_every_store_write_is_a_server_span_under_the_harness_span(traced: Traced) -> None:
    """The sink's begin_call and put and the resolver's resolve are children of the harness."""
    store = "token-finalizer-store"
    writes = [
        *traced.named(store, f"POST {ROUTE}/intents"),
        *traced.named(store, f"PUT {ROUTE}/calls/{{model_call_id:path}}"),
        *traced.named(store, f"POST {ROUTE}/lineage/resolve"),
    ]
    assert len(writes) == 7
    assert {(span.parent_span_id, span.kind) for span in writes} == {
        (traced.harness_span_id, _SERVER)
    }


def test_redis_script_calls_are_children_of_their_store_route(traced: Traced) -> None:
    """Each put's, begin_call's and resolve's script span has that route's span as parent."""
    store = "token-finalizer-store"
    for route, script in [
        (f"POST {ROUTE}/intents", "redis begin_call"),
        (f"PUT {ROUTE}/calls/{{model_call_id:path}}", "redis put"),
        (f"POST {ROUTE}/lineage/resolve", "redis resolve"),
    ]:
        parents = {traced.by_id(span.parent_span_id).name for span in traced.named(store, script)}
        assert parents == {route}, script


def test_finalize_has_build_freeze_and_encode_under_it(traced: Traced) -> None:
    """POST /finalize's parent is the harness; build and encode are its children, freeze build's."""
    finalize = traced.one("token-finalizer", "POST /finalize")
    build = traced.one("token-finalizer", "build")
    freeze = traced.one("token-finalizer", "freeze")
    encode = traced.one("token-finalizer", "encode")
    assert (finalize.parent_span_id, build.parent_span_id, encode.parent_span_id) == (
        traced.harness_span_id,
        finalize.span_id,
        finalize.span_id,
    )
    assert freeze.parent_span_id == build.span_id


def test_the_finalizers_freeze_continues_into_the_stores_freeze_and_its_script(
    traced: Traced,
) -> None:
    """The store's freeze route is a child of the finalizer's freeze span, its script of it."""
    freeze = traced.one("token-finalizer", "freeze")
    served = traced.one("token-finalizer-store", f"POST {ROUTE}/freeze")
    script = traced.one("token-finalizer-store", "redis freeze")
    assert (served.parent_span_id, script.parent_span_id) == (freeze.span_id, served.span_id)


def test_retire_continues_through_drop_into_the_store(traced: Traced) -> None:
    """POST /retire -> drop -> the store's drop route -> its script, one parent after another."""
    retire = traced.one("token-finalizer", "POST /retire")
    drop = traced.one("token-finalizer", "drop")
    served = traced.one("token-finalizer-store", f"POST {ROUTE}/drop")
    script = traced.one("token-finalizer-store", "redis drop")
    assert [retire.parent_span_id, drop.parent_span_id, served.parent_span_id] == [
        traced.harness_span_id,
        retire.span_id,
        drop.span_id,
    ]
    assert script.parent_span_id == served.span_id


def test_server_spans_carry_the_rollout_source_and_outcome(traced: Traced) -> None:
    """/finalize's span names the rollout, the source and the outcome; a store route its rollout."""
    finalize = traced.one("token-finalizer", "POST /finalize")
    freeze = traced.one("token-finalizer-store", f"POST {ROUTE}/freeze")
    assert (
        finalize.attributes["token_finalizer.rollout_id"],
        finalize.attributes["token_finalizer.source"],
        finalize.attributes["token_finalizer.outcome"],
        freeze.attributes["token_finalizer.rollout_id"],
    ) == (ROLLOUT, "store", "ok", ROLLOUT)


def test_no_attribute_holds_a_token_id(traced: Traced) -> None:
    """No attribute value of any span is, or spells, one of the rollout's token ids."""
    values = [value for span in traced.spans for value in span.attributes.values()]
    flat = [item for value in values for item in (value if isinstance(value, list) else [value])]
    assert not [item for item in flat if isinstance(item, int) and item in traced.token_ids]
    spelled = {str(token) for token in traced.token_ids}
    assert not [item for item in flat if isinstance(item, str) and any(t in item for t in spelled)]


def test_each_server_exports_under_its_default_service_name(traced: Traced) -> None:
    """Without OTEL_SERVICE_NAME the two servers are token-finalizer and token-finalizer-store."""
    assert {span.service for span in traced.spans} == {"token-finalizer", "token-finalizer-store"}


def test_only_our_spans_are_exported_fastapi_telemetry_stays_off(traced: Traced) -> None:
    """Every span is our tracer's, and nothing but traces is exported, FastAPI asked or not."""
    assert ({span.scope for span in traced.spans}, traced.exported_to) == (
        {"token_finalizer"},
        {"/v1/traces"},
    )
