"""deploy/kubernetes/: the kustomize base and its Redis Cluster overlay, rendered and validated.

Rendered by tests/support/kustomize.py (no kustomize binary here) and checked
offline against the Kubernetes schema (kubernetes-validate), then against the
code: the commands parse with the real CLI, the probes and the scrape
annotation name served routes, the configuration loads with the pods'
environment, and the store starts without a token warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.support.kustomize import render
from token_finalizer._constants import GRACEFUL_SHUTDOWN_S
from token_finalizer.api import create_app
from token_finalizer.cli import build_parser
from token_finalizer.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
KUBERNETES = ROOT / "deploy" / "kubernetes"
KUSTOMIZATIONS = {
    "base": KUBERNETES / "base",
    "redis-cluster": KUBERNETES / "overlays" / "redis-cluster",
}


@pytest.fixture(scope="module", params=sorted(KUSTOMIZATIONS))
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """The resources of one kustomization, as `kustomize build` renders them."""
    return render(KUSTOMIZATIONS[request.param])


def _one(resources: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    return found


def _container(resources: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (container,) = _one(resources, "Deployment", name)["spec"]["template"]["spec"]["containers"]
    return container


def _secret_values(resources: list[dict[str, Any]]) -> dict[str, str]:
    return dict(_one(resources, "Secret", "token-finalizer")["stringData"])


def _environment(resources: list[dict[str, Any]], name: str) -> dict[str, str]:
    """A Deployment container's environment, Secret references resolved."""
    secret = _secret_values(resources)
    env = {}
    for variable in _container(resources, name)["env"]:
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        else:
            reference = variable["valueFrom"]["secretKeyRef"]
            assert reference["name"] == "token-finalizer"
            env[variable["name"]] = secret[reference["key"]]
    return env


def _finalizer_settings(resources: list[dict[str, Any]], tmp_path: Path) -> Settings:
    config = tmp_path / "config.yaml"
    config.write_text(_one(resources, "ConfigMap", "finalizer-config")["data"]["config.yaml"])
    return load_settings(config, env=_environment(resources, "finalizer"))


def test_every_rendered_resource_is_valid_kubernetes(rendered: list[dict[str, Any]]) -> None:
    """Each resource passes the latest Kubernetes schema, strictly (no unknown field)."""
    version = kubernetes_validate.latest_version()
    for resource in rendered:
        kubernetes_validate.validate(resource, version, strict=True)


def test_both_servers_have_a_deployment_a_service_and_a_disruption_budget(
    rendered: list[dict[str, Any]],
) -> None:
    """The finalizer and the store: Deployment, Service, PDB, all selecting the pods' labels."""
    for name in ("finalizer", "capture-store"):
        deployment = _one(rendered, "Deployment", name)
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        selectors = [
            _one(rendered, "Service", name)["spec"]["selector"],
            _one(rendered, "PodDisruptionBudget", name)["spec"]["selector"]["matchLabels"],
            deployment["spec"]["selector"]["matchLabels"],
        ]
        assert all(selector.items() <= labels.items() for selector in selectors)
        assert deployment["spec"]["replicas"] >= 2


def test_finalizer_runs_serve_with_the_mounted_config(rendered: list[dict[str, Any]]) -> None:
    """The finalizer's args are `token-finalizer serve --workers 2` on the mounted ConfigMap."""
    container = _container(rendered, "finalizer")
    args = build_parser().parse_args(container["args"][1:])
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert (container["args"][0], args._run.__name__, args.workers) == (
        "token-finalizer",
        "serve",
        2,
    )
    assert args.config == f"{mounts['config']}/config.yaml"
    assert str(args.port) == str(container["ports"][0]["containerPort"])


def test_finalizer_probes_are_health_and_ready(rendered: list[dict[str, Any]]) -> None:
    """Liveness probes /health, readiness /ready, both routes of the served API."""
    container = _container(rendered, "finalizer")
    paths = set(create_app(Settings()).openapi()["paths"])
    live, ready = container["livenessProbe"]["httpGet"], container["readinessProbe"]["httpGet"]
    assert (live["path"], ready["path"]) == ("/health", "/ready")
    assert {live["path"], ready["path"]} <= paths


def test_finalizer_leaves_the_service_within_the_drain_and_finishes_in_flight_work(
    rendered: list[dict[str, Any]],
) -> None:
    """Readiness fails within the drain period; the grace period covers drain plus shutdown."""
    container = _container(rendered, "finalizer")
    args = build_parser().parse_args(container["args"][1:])
    probe = container["readinessProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] < args.drain_seconds
    grace = _one(rendered, "Deployment", "finalizer")["spec"]["template"]["spec"]
    assert grace["terminationGracePeriodSeconds"] > args.drain_seconds + GRACEFUL_SHUTDOWN_S


def test_finalizer_pods_carry_the_prometheus_scrape_annotations(
    rendered: list[dict[str, Any]],
) -> None:
    """prometheus.io/scrape, port and path name the container's port and the served /metrics."""
    template = _one(rendered, "Deployment", "finalizer")["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    port = _container(rendered, "finalizer")["ports"][0]["containerPort"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert (annotations["prometheus.io/port"], annotations["prometheus.io/path"]) == (
        str(port),
        "/metrics",
    )
    assert "/metrics" in create_app(Settings()).openapi()["paths"]


def test_every_container_sets_resources(rendered: list[dict[str, Any]]) -> None:
    """Every container of every workload requests CPU and memory and caps its memory."""
    for resource in rendered:
        spec = resource.get("spec", {}).get("template", {}).get("spec")
        for container in (spec or {}).get("containers", []):
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), resource["metadata"]["name"]
            assert "memory" in resources["limits"]


def test_secrets_are_placeholders_only(rendered: list[dict[str, Any]]) -> None:
    """The Secret holds placeholders to replace, one distinct value per key; nothing real."""
    values = _secret_values(rendered)
    assert set(values) == {
        "writer-token",
        "store-finalizer-token",
        "store-control-token",
        "finalizer-token",
        "retire-key",
    }
    assert all(value.startswith("REPLACE-WITH-") for value in values.values())
    assert len(set(values.values())) == len(values)


def test_finalizer_config_loads_with_the_pods_environment(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The ConfigMap passes the real loader with the finalizer's environment (Secret values)."""
    settings = _finalizer_settings(rendered, tmp_path)
    secret = _secret_values(rendered)
    assert settings.sources["store"].token == secret["store-finalizer-token"]
    assert (settings.retire.key, settings.auth.bearer_tokens) == (
        secret["retire-key"],
        (secret["finalizer-token"],),
    )
    assert settings.guard.redis is not None


def test_store_has_a_token_per_role_and_warns_nothing(
    rendered: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`store serve` with the store's args and environment starts without a token warning."""
    from token_finalizer.cli.store.serve import _store_tokens, _token_warnings

    for variable, value in _environment(rendered, "capture-store").items():
        monkeypatch.setenv(variable, value)
    monkeypatch.delenv("TOKEN_FINALIZER_STORE_TOKEN", raising=False)
    args = build_parser().parse_args(_container(rendered, "capture-store")["args"][1:])
    assert _token_warnings(_store_tokens(args)) == []


def _service_of(host: str | None) -> str:
    """The Service a cluster DNS name resolves through: `pod.service` or `service`."""
    assert host is not None
    return host.split(".")[-1]


def test_every_redis_address_names_a_rendered_service(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The store's --redis URLs and the finalizers' redis source name Services rendered here."""
    from urllib.parse import urlsplit

    services = {r["metadata"]["name"] for r in rendered if r["kind"] == "Service"}
    args = build_parser().parse_args(_container(rendered, "capture-store")["args"][1:])
    source = _finalizer_settings(rendered, tmp_path).sources["redis"]
    urls = [*args.redis, *([source.url] if source.url else []), *(source.urls or ())]
    assert urls and {_service_of(urlsplit(url).hostname) for url in urls} <= services


def test_the_overlay_runs_the_store_on_the_cluster_with_acknowledged_writes() -> None:
    """The redis-cluster overlay drops the single Redis and serves the store on the cluster."""
    resources = render(KUSTOMIZATIONS["redis-cluster"])
    kinds = {(r["kind"], r["metadata"]["name"]) for r in resources}
    assert ("StatefulSet", "redis") not in kinds and ("StatefulSet", "redis-cluster") in kinds
    args = build_parser().parse_args(_container(resources, "capture-store")["args"][1:])
    assert (args.redis_cluster, args.min_replicas_acked, len(args.redis)) == (True, 1, 2)


def test_the_renderer_refuses_what_it_does_not_render(tmp_path: Path) -> None:
    """A kustomization key the test renderer does not apply is an error, never ignored."""
    (tmp_path / "kustomization.yaml").write_text("resources: []\nnamePrefix: x-\n")
    with pytest.raises(ValueError, match="namePrefix"):
        render(tmp_path)
