"""Static checks of the Dockerfile and docker-compose.yml (no Docker engine runs here).

The files must agree with the code: their commands parse with the real CLI,
their ports and health paths are the ones the servers listen on and serve.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from token_finalizer.api import create_app
from token_finalizer.cli import build_parser
from token_finalizer.settings import Settings, load_settings
from token_finalizer.sources import MemoryTokenStore
from token_finalizer.store_server import create_store_app

ROOT = Path(__file__).resolve().parent.parent
_HEALTH_URL = re.compile(r"urlopen\('(http://[^']+)'")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """docker-compose.yml, parsed."""
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def dockerfile() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _instruction(lines: list[str], name: str) -> list[str]:
    return [line[len(name) :].strip() for line in lines if line.split()[0].upper() == name]


def _option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def _health_url(test: list[str]) -> Any:
    """The URL a python-urllib healthcheck probes."""
    command = test[1:] if test[0] == "CMD" else test
    assert command[0] in {"python", "python3"} and command[1] == "-c"
    code = test[-1]
    assert "urllib.request.urlopen" in code
    match = _HEALTH_URL.search(code)
    assert match is not None
    return urlsplit(match.group(1))


def _finalizer_paths() -> set[str]:
    return set(create_app(Settings()).openapi()["paths"])


def _store_paths() -> set[str]:
    return set(create_store_app(MemoryTokenStore()).openapi()["paths"])


REPLICAS = ("finalizer-a", "finalizer-b")
_COMPOSE_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-?][^}]*)?\}")
# What an operator exports before `docker compose up`.
OPERATOR_ENV = {
    "WRITER_TOKEN": "store-writer-token",
    "STORE_FINALIZER_TOKEN": "store-finalizer-token",
    "STORE_CONTROL_TOKEN": "store-control-token",
    "FINALIZER_TOKEN": "finalizer-token",
    "RETIRE_KEY": "retire-key-of-the-operator-0123456789",
}


def _service_env(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as the container sees it (compose's ${VAR:?...} resolved)."""
    return {
        name: _COMPOSE_VARIABLE.sub(lambda match: OPERATOR_ENV[match.group(1)], str(value))
        for name, value in service.get("environment", {}).items()
    }


def _mounted_config(compose: dict[str, Any], service: dict[str, Any]) -> Path:
    """The repository file a service gets as its --config (through `configs`)."""
    (config,) = service["configs"]
    source = compose["configs"][config["source"]]["file"]
    return ROOT / source


def _replica_settings(compose: dict[str, Any], name: str) -> Settings:
    """A replica's configuration, loaded by the real loader with the container's environment."""
    service = compose["services"][name]
    return load_settings(_mounted_config(compose, service), env=_service_env(service))


def _url(value: str | None) -> Any:
    return urlsplit(value or "")


# -- docker-compose.yml -------------------------------------------------------


def _default_services(compose: dict[str, Any]) -> list[str]:
    """The services `docker compose up` starts (those of no profile)."""
    return sorted(
        name for name, service in compose["services"].items() if "profiles" not in service
    )


def test_compose_has_the_scaled_out_topology(compose: dict[str, Any]) -> None:
    """Redis, a capture store on it, two finalizer replicas and a one-shot smoke test."""
    assert _default_services(compose) == [
        "capture-store",
        "finalizer-a",
        "finalizer-b",
        "redis",
        "smoke",
    ]


def test_redis_is_checked_with_redis_cli_ping(compose: dict[str, Any]) -> None:
    """Redis is healthy once `redis-cli ping` answers; its data is a named volume."""
    redis = compose["services"]["redis"]
    volume, _, target = redis["volumes"][0].partition(":")
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert (volume in compose["volumes"], target) == (True, "/data")


def test_store_command_serves_redis(compose: dict[str, Any]) -> None:
    """The store runs `token-finalizer store serve --redis redis://redis:6379/0` on 0.0.0.0:8100."""
    command = compose["services"]["capture-store"]["command"]
    args = build_parser().parse_args(command[1:])
    (redis_url,) = map(_url, args.redis)
    assert (command[0], args._run.__name__, args.dir, args.host, args.port) == (
        "token-finalizer",
        "store_serve",
        None,
        "0.0.0.0",
        8100,
    )
    assert (redis_url.scheme, redis_url.hostname, redis_url.port) == ("redis", "redis", 6379)


@pytest.mark.parametrize("name", REPLICAS)
def test_replica_command_is_the_cli_serve_with_workers(compose: dict[str, Any], name: str) -> None:
    """Each replica runs `token-finalizer serve --workers 2` with the mounted config, on 0.0.0.0."""
    service = compose["services"][name]
    args = build_parser().parse_args(service["command"][1:])
    mounted = [config["target"] for config in service["configs"]]
    assert (args._run.__name__, args.host, [args.config], args.workers) == (
        "serve",
        "0.0.0.0",
        mounted,
        2,
    )


def test_replicas_are_identical_but_for_their_published_port(compose: dict[str, Any]) -> None:
    """Stateless replicas: same command, config and environment; host ports 8000 and 8001."""
    a, b = (dict(compose["services"][name]) for name in REPLICAS)
    ports = (a.pop("ports"), b.pop("ports"))
    assert a == b
    assert ports == (["8000:8000"], ["8001:8000"])


@pytest.mark.parametrize("name", ["capture-store", *REPLICAS])
def test_published_port_is_the_served_port(compose: dict[str, Any], name: str) -> None:
    """Each service publishes the port its command listens on."""
    service = compose["services"][name]
    container_port = service["ports"][0].rsplit(":", 1)[1]
    assert container_port == _option(service["command"], "--port")


@pytest.mark.parametrize("name", ["capture-store", *REPLICAS])
def test_healthcheck_probes_the_served_port(compose: dict[str, Any], name: str) -> None:
    """Each healthcheck probes, with python's urllib, the port its command listens on."""
    service = compose["services"][name]
    url = _health_url(service["healthcheck"]["test"])
    assert str(url.port) == _option(service["command"], "--port")


@pytest.mark.parametrize("name", REPLICAS)
def test_replica_healthcheck_is_readiness(compose: dict[str, Any], name: str) -> None:
    """A replica is healthy when /ready (a route of the finalizer API) answers 2xx."""
    url = _health_url(compose["services"][name]["healthcheck"]["test"])
    assert (url.path, url.path in _finalizer_paths()) == ("/ready", True)


def test_store_healthcheck_path_is_served(compose: dict[str, Any]) -> None:
    """The store's healthcheck path is a route of the capture-store app."""
    url = _health_url(compose["services"]["capture-store"]["healthcheck"]["test"])
    assert url.path in _store_paths()


def test_start_order_waits_for_health(compose: dict[str, Any]) -> None:
    """redis -> capture-store -> both replicas -> smoke, each waiting for service_healthy."""
    services = compose["services"]
    healthy = {"condition": "service_healthy"}
    assert services["capture-store"]["depends_on"] == {"redis": healthy}
    for name in REPLICAS:
        assert services[name]["depends_on"] == {"redis": healthy, "capture-store": healthy}
    assert services["smoke"]["depends_on"] == {name: healthy for name in REPLICAS}


def test_every_dependency_has_a_healthcheck(compose: dict[str, Any]) -> None:
    """A service_healthy condition only names services that define a healthcheck."""
    services = compose["services"]
    for service in services.values():
        for name, condition in service.get("depends_on", {}).items():
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[name], name


@pytest.mark.parametrize("name", REPLICAS)
def test_replica_config_is_valid(compose: dict[str, Any], name: str) -> None:
    """deploy/finalizer.yaml passes the real loader with the replica's environment."""
    settings = _replica_settings(compose, name)
    assert (settings.default_source, sorted(settings.sources)) == ("store", ["redis", "store"])
    assert (settings.auth.bearer_tokens, settings.retire.key) == (
        ("finalizer-token",),
        "retire-key-of-the-operator-0123456789",
    )
    assert settings.token_id_capture.max_mask_fraction is not None


def test_replica_config_points_at_the_compose_services(compose: dict[str, Any]) -> None:
    """The http source names the store service's port; the redis source and guard its Redis."""
    settings = _replica_settings(compose, "finalizer-a")
    store = _url(settings.sources["store"].url)
    store_port = _option(compose["services"]["capture-store"]["command"], "--port")
    assert (store.hostname, str(store.port)) == ("capture-store", store_port)
    assert settings.sources["store"].token == "store-finalizer-token"
    store_redis = _option(compose["services"]["capture-store"]["command"], "--redis")
    assert settings.sources["redis"].url == store_redis
    assert settings.guard.redis is not None and settings.guard.redis.seeds == (store_redis,)


def test_replica_config_shares_the_guard_and_the_retire_key(compose: dict[str, Any]) -> None:
    """Both replicas: the same guard in Redis and the same retire key (interchangeable)."""
    a, b = (_replica_settings(compose, name) for name in REPLICAS)
    assert a.guard.redis is not None
    assert (a.guard, a.retire, a.sources) == (b.guard, b.retire, b.sources)


@pytest.mark.parametrize("name", REPLICAS)
def test_replica_gets_every_variable_its_config_reads(compose: dict[str, Any], name: str) -> None:
    """Every ${VAR} in a value of deploy/finalizer.yaml is set in the replica's environment."""
    service = compose["services"][name]
    wanted = set()
    pending = [yaml.safe_load(_mounted_config(compose, service).read_text())]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, str):
            wanted.update(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", value))
    assert wanted
    assert wanted <= set(service["environment"])


_STORE_ROLE_VARIABLES = {
    "writer": "TOKEN_FINALIZER_STORE_WRITER_TOKENS",
    "finalizer": "TOKEN_FINALIZER_STORE_FINALIZER_TOKENS",
    "control": "TOKEN_FINALIZER_STORE_CONTROL_TOKENS",
}


@pytest.mark.parametrize("name", ["capture-store", "capture-store-cluster"])
def test_store_has_a_token_per_role(compose: dict[str, Any], name: str) -> None:
    """The store gets one distinct token per role, and no token valid for every role."""
    env = _service_env(compose["services"][name])
    assert "TOKEN_FINALIZER_STORE_TOKEN" not in env
    tokens = [env[variable] for variable in _STORE_ROLE_VARIABLES.values()]
    assert len(set(tokens)) == 3


@pytest.mark.parametrize("name", ["capture-store", "capture-store-cluster"])
def test_store_serve_warns_nothing_at_start(
    compose: dict[str, Any], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`store serve` with the service's command and environment has no token warning."""
    from token_finalizer.cli.store.serve import _store_tokens, _token_warnings

    service = compose["services"][name]
    for variable, value in _service_env(service).items():
        monkeypatch.setenv(variable, value)
    monkeypatch.delenv("TOKEN_FINALIZER_STORE_TOKEN", raising=False)
    args = build_parser().parse_args(service["command"][1:])
    assert _token_warnings(_store_tokens(args)) == []


def test_finalizers_hold_the_store_finalizer_token_and_smoke_the_writer_token(
    compose: dict[str, Any],
) -> None:
    """Replicas reach the store with its finalizer token; the smoke test writes as a writer."""
    store = _service_env(compose["services"]["capture-store"])
    for name in (*REPLICAS, "finalizer-cluster"):
        settings = _replica_settings(compose, name)
        assert settings.sources["store"].token == store[_STORE_ROLE_VARIABLES["finalizer"]]
    smoke = _service_env(compose["services"]["smoke"])
    assert smoke["CAPTURE_TOKEN"] == store[_STORE_ROLE_VARIABLES["writer"]]


def test_smoke_runs_the_mounted_example_against_the_services(compose: dict[str, Any]) -> None:
    """smoke runs examples/compose_smoke.py (mounted) with URLs of the store and both replicas."""
    smoke = compose["services"]["smoke"]
    source, target, mode = smoke["volumes"][0].split(":")
    env = _service_env(smoke)
    served = {
        name: _option(compose["services"][name]["command"], "--port")
        for name in ("capture-store", *REPLICAS)
    }
    assert (smoke["command"], (ROOT / source).is_file(), mode) == (["python", target], True, "ro")
    for variable, name in [
        ("CAPTURE_STORE_URL", "capture-store"),
        ("FINALIZER_A_URL", "finalizer-a"),
        ("FINALIZER_B_URL", "finalizer-b"),
    ]:
        url = _url(env[variable])
        assert (url.hostname, str(url.port)) == (name, served[name])
    assert (
        env["FINALIZER_TOKEN"]
        == _service_env(compose["services"]["finalizer-a"])["FINALIZER_TOKEN"]
    )
    assert smoke["restart"] == "no"


@pytest.mark.parametrize("name", REPLICAS)
def test_replica_may_finish_in_flight_requests(compose: dict[str, Any], name: str) -> None:
    """The stop grace period outlasts the server's graceful shutdown."""
    from token_finalizer._constants import GRACEFUL_SHUTDOWN_S

    grace = compose["services"][name]["stop_grace_period"]
    assert int(grace.removesuffix("s")) > GRACEFUL_SHUTDOWN_S


def test_compose_requires_the_operator_secrets(compose: dict[str, Any]) -> None:
    """Tokens and the retire key have no defaults: compose stops with a message when unset."""
    text = (ROOT / "docker-compose.yml").read_text()
    for variable in OPERATOR_ENV:
        assert re.search(r"\$\{" + variable + r":\?[^}]+\}", text), variable


# -- docker-compose.yml, profile `cluster` ------------------------------------

CLUSTER_NODES = [f"redis-cluster-{number}" for number in range(1, 7)]


def test_cluster_profile_adds_a_cluster_and_its_store_and_finalizer(
    compose: dict[str, Any],
) -> None:
    """`--profile cluster`: six Redis nodes, a one-shot that joins them, a store and a finalizer."""
    profiled = sorted(name for name, s in compose["services"].items() if "profiles" in s)
    assert profiled == sorted(
        [*CLUSTER_NODES, "redis-cluster-init", "capture-store-cluster", "finalizer-cluster"]
    )
    assert all(compose["services"][name]["profiles"] == ["cluster"] for name in profiled)


def _node_timeout_s(compose: dict[str, Any]) -> float:
    (timeout,) = {
        _option(compose["services"][name]["command"], "--cluster-node-timeout")
        for name in CLUSTER_NODES
    }
    return int(timeout) / 1000


def test_cluster_nodes_run_in_cluster_mode_with_persistence(compose: dict[str, Any]) -> None:
    """Each node: cluster-enabled, append-only file on its own volume, checked by PING."""
    for name in CLUSTER_NODES:
        node = compose["services"][name]
        volume, _, target = node["volumes"][0].partition(":")
        assert _option(node["command"], "--cluster-enabled") == "yes"
        assert _option(node["command"], "--appendonly") == "yes"
        assert (volume in compose["volumes"], target) == (True, "/data")
        assert node["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_cluster_init_joins_every_node_with_one_replica_each(compose: dict[str, Any]) -> None:
    """The one-shot creates 3 primaries x 1 replica from all six nodes, after each is healthy."""
    init = compose["services"]["redis-cluster-init"]
    script = init["command"][-1]
    assert "--cluster create" in script and "--cluster-replicas 1" in script
    assert "redis-cluster-$$n" in script and "1 2 3 4 5 6" in script
    assert init["depends_on"] == {name: {"condition": "service_healthy"} for name in CLUSTER_NODES}


def test_cluster_store_command_reaches_the_cluster(compose: dict[str, Any]) -> None:
    """`store serve --redis-cluster` with two node seeds and one acknowledging replica."""
    service = compose["services"]["capture-store-cluster"]
    args = build_parser().parse_args(service["command"][1:])
    hosts = [_url(url).hostname for url in args.redis]
    assert (args._run.__name__, args.redis_cluster, args.min_replicas_acked) == (
        "store_serve",
        True,
        1,
    )
    assert hosts == CLUSTER_NODES[:2]
    assert service["depends_on"] == {
        "redis-cluster-init": {"condition": "service_completed_successfully"}
    }
    # A failover takes about the node timeout plus a second; the deadline outlasts it.
    assert _node_timeout_s(compose) <= args.redis_timeout - 2


def test_cluster_finalizer_config_reaches_the_cluster(compose: dict[str, Any]) -> None:
    """deploy/finalizer-cluster.yaml: a cluster source and guard on the node seeds."""
    settings = _replica_settings(compose, "finalizer-cluster")
    source = settings.sources["redis"]
    store = _url(settings.sources["store"].url)
    assert (store.hostname, store.port) == ("capture-store-cluster", 8100)
    assert (source.cluster, source.min_replicas_acked) == (True, 1)
    assert [_url(url).hostname for url in source.urls or ()] == CLUSTER_NODES[:2]
    assert settings.guard.redis is not None and settings.guard.redis.cluster
    assert _node_timeout_s(compose) <= source.timeout_s - 2
    assert _node_timeout_s(compose) <= settings.guard.timeout_s - 2


# -- Dockerfile ---------------------------------------------------------------


def test_dockerfile_builds_every_stage_on_one_base_argument(dockerfile: list[str]) -> None:
    """Every stage builds FROM ${BASE_IMAGE}, declared before the first FROM."""
    bases = [line.split()[0] for line in _instruction(dockerfile, "FROM")]
    first_from = next(i for i, line in enumerate(dockerfile) if line.upper().startswith("FROM "))
    declared = [line for line in dockerfile[:first_from] if line.startswith("ARG BASE_IMAGE=")]
    assert (len(bases), set(bases), len(declared)) == (2, {"${BASE_IMAGE}"}, 1)


def test_dockerfile_defaults_to_a_public_slim_python_of_a_current_minor(
    dockerfile: list[str],
) -> None:
    """BASE_IMAGE defaults to python:3.N-slim, N a supported minor of 3.12 or later."""
    declared = [line for line in dockerfile if line.startswith("ARG BASE_IMAGE=")]
    (default,) = [line.split("=", 1)[1] for line in declared]
    match = re.fullmatch(r"python:3\.(\d+)-slim", default)
    assert match is not None and int(match.group(1)) >= 12


def test_dockerfile_offline_build_arguments_reach_pip(dockerfile: list[str]) -> None:
    """The build stage declares PIP_NO_INDEX and PIP_FIND_LINKS, so pip can install offline."""
    args = {line.split()[1].split("=")[0] for line in dockerfile if line.startswith("ARG ")}
    assert {"PIP_NO_INDEX", "PIP_FIND_LINKS"} <= args


def test_dockerfile_installs_from_the_committed_constraints(dockerfile: list[str]) -> None:
    """The image installs with `-c constraints.txt`, which pins every runtime dependency."""
    installs = [run for run in _instruction(dockerfile, "RUN") if "pip install" in run]
    assert any("-c /src/constraints.txt" in run for run in installs)
    pinned = {
        line.split("==")[0]
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    assert {"fastapi", "uvicorn", "httpx", "orjson", "numpy", "redis", "stamina"} <= pinned


def test_dockerfile_runs_as_a_non_root_user(dockerfile: list[str]) -> None:
    """The final USER is neither root nor uid 0."""
    user = _instruction(dockerfile, "USER")[-1].split(":")[0]
    assert user not in {"root", "0"}


def test_dockerfile_cmd_is_exec_form_serve(dockerfile: list[str]) -> None:
    """CMD is a JSON array (exec form) running `token-finalizer serve` on 0.0.0.0."""
    command = json.loads(_instruction(dockerfile, "CMD")[-1])
    args = build_parser().parse_args(command[1:])
    assert (command[0], args._run.__name__, args.host) == ("token-finalizer", "serve", "0.0.0.0")


def test_dockerfile_healthcheck_probes_the_served_health_path(dockerfile: list[str]) -> None:
    """HEALTHCHECK uses python's urllib on the CMD's port and the API's /health."""
    healthcheck = _instruction(dockerfile, "HEALTHCHECK")[-1]
    test = json.loads(healthcheck[healthcheck.index("CMD") + len("CMD") :].strip())
    url = _health_url(["CMD", *test])
    port = _option(json.loads(_instruction(dockerfile, "CMD")[-1]), "--port")
    assert (str(url.port), url.path in _finalizer_paths()) == (port, True)


def test_dockerfile_installs_both_packages(dockerfile: list[str]) -> None:
    """The build copies the service and client packages and installs both distributions.

    The client distribution is not on PyPI: the service's requirement on it is
    met only when one pip command installs the copied client/ with the project.
    """
    copied = " ".join(_instruction(dockerfile, "COPY"))
    installs = [
        shlex.split(command)
        for run in _instruction(dockerfile, "RUN")
        for command in run.split("&&")
        if "pip install" in command
    ]
    both = any({"/src/client", "/src"} <= set(install) for install in installs)
    assert ("service" in copied, "client" in copied, both) == (True, True, True)


def test_dockerfile_user_owns_the_data_directory(dockerfile: list[str]) -> None:
    """The directory the store volume mounts on is created owned by the service user."""
    runs = " ".join(_instruction(dockerfile, "RUN"))
    install = next(part for part in runs.split("&&") if "install -d" in part)
    assert ("/data" in shlex.split(install), "-o finalizer" in install) == (True, True)


# -- the secrets compose requires, as the README and the Dockerfile tell them -----


def _required_by_compose() -> set[str]:
    """Variables docker-compose.yml refuses to start without (`${VAR:?message}`)."""
    text = (ROOT / "docker-compose.yml").read_text()
    return set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*):\?", text))


def _assigned_before_compose_up(lines: list[str]) -> set[str]:
    """Variables set (`VAR=...`, `export A=... B=...`) on the lines up to `docker compose up`."""
    names: set[str] = set()
    for line in lines:
        command = line.split("#", 1)[0]
        names.update(re.findall(r"(?:^|\s)([A-Z][A-Z0-9_]*)=", command))
        if "docker compose up" in command:
            return names
    raise AssertionError("no `docker compose up` line")


def _readme_deployment_block() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Deployment and scale-out\n", 1)[1].split("\n## ", 1)[0]
    (block,) = [b for b in re.findall(r"```bash\n(.*?)```", section, re.DOTALL) if "compose" in b]
    return block.splitlines()


def test_compose_requires_exactly_the_operator_secrets() -> None:
    """The variables compose requires are the three an operator exports (none added unseen)."""
    assert _required_by_compose() == set(OPERATOR_ENV)


def test_readme_compose_command_sets_every_required_variable() -> None:
    """The README's compose command sets every variable compose requires before `up`."""
    assert _required_by_compose() <= _assigned_before_compose_up(_readme_deployment_block())


def test_dockerfile_header_sets_every_required_variable() -> None:
    """The Dockerfile header's compose command sets every variable compose requires too."""
    header = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lstrip("# "))
    assert _required_by_compose() <= _assigned_before_compose_up(header)


def _dockerignore_pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex over paths relative to the build context.

    `**` spans any number of directories (none included), `*` and `?` stay
    within one path segment, as Docker matches them.
    """
    regex = ""
    index = 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            regex, index = regex + "(?:.*/)?", index + 3
        elif pattern.startswith("**", index):
            regex, index = regex + ".*", index + 2
        elif pattern[index] == "*":
            regex, index = regex + "[^/]*", index + 1
        elif pattern[index] == "?":
            regex, index = regex + "[^/]", index + 1
        else:
            regex, index = regex + re.escape(pattern[index]), index + 1
    return re.compile(regex)


def _ignored(path: str) -> bool:
    """Whether the build context leaves `path` out (it, or a directory above it, matches)."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [
        _dockerignore_pattern(line.strip()) for line in lines if line.strip()[:1] not in "#"
    ]
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    return any(p.fullmatch(prefix) for p in patterns for prefix in prefixes)


@pytest.mark.parametrize(
    "path",
    [
        "service/token_finalizer.egg-info/PKG-INFO",
        "client/token_finalizer_client.egg-info/PKG-INFO",
        "client/build/lib/token_finalizer_client/__init__.py",
        "client/dist/token_finalizer_client-0.2.0-py3-none-any.whl",
        "build/lib/token_finalizer/__init__.py",
        ".venv/bin/python",
        ".venv-3.13/bin/python",
        "service/token_finalizer/__pycache__/settings.cpython-311.pyc",
        "tests/conftest.py",
    ],
)
def test_dockerignore_leaves_out_local_build_output(path: str) -> None:
    """Build output, install metadata and virtualenvs at any depth never reach the image."""
    assert _ignored(path)


@pytest.mark.parametrize(
    "path",
    [
        "pyproject.toml",
        "constraints.txt",
        "service/token_finalizer/core/build.py",
        "client/token_finalizer_client/__init__.py",
        "client/pyproject.toml",
    ],
)
def test_dockerignore_keeps_what_the_image_is_built_from(path: str) -> None:
    """The files the Dockerfile copies stay in the build context."""
    assert not _ignored(path)


# -- README and .ci/run ----------------------------------------------------------


def _setup_commands() -> list[str]:
    """The bash blocks of the README's "Set up" section."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.DOTALL)]


def test_readme_shows_two_set_up_commands() -> None:
    """The README's set-up is two commands: install + serve, and the tests."""
    commands = _setup_commands()
    assert (len(commands), "token-finalizer serve" in commands[0], "pytest" in commands[1]) == (
        2,
        True,
        True,
    )


# What the README's commands may run without its Set up naming it: the
# shell's own, Python (Set up starts with it), the project's commands, Docker
# (its own section says so).
_NEEDS_NO_MENTION = {"export", "python3", "token-finalizer", "docker"}


def _readme_programs() -> set[str]:
    """The program each command (each piped or chained part) of the README bash blocks runs."""
    readme = (ROOT / "README.md").read_text()
    programs = set()
    for block in re.findall(r"```bash\n(.*?)```", readme, re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"\|\||&&|\||;", line.split(" # ", 1)[0]):
                words = [word for word in part.split() if "=" not in word.split("/")[0]]
                if words and not words[0].startswith(("#", "-")):
                    programs.add(words[0])
    return programs


def test_readme_set_up_names_every_program_its_commands_run() -> None:
    """Every program the README's commands run (curl, jq...) is named in its Set up section."""
    readme = (ROOT / "README.md").read_text()
    set_up = readme.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    programs = {p for p in _readme_programs() if not p.startswith(".venv/bin/")}
    missing = {p for p in programs - _NEEDS_NO_MENTION if f"`{p}`" not in set_up}
    assert "jq" in programs and missing == set()


def _ci_commands() -> list[str]:
    """The lines of .ci/run that are commands: no comments, no blank lines."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run runs the README's test command, verbatim, as a line of its own."""
    assert _setup_commands()[1] in _ci_commands()


def test_ci_runs_the_image_and_topology_last() -> None:
    """.ci/run's last command is .ci/compose-e2e, after the README's test command."""
    commands = _ci_commands()
    tests = commands.index(_setup_commands()[1])
    assert commands[-1] == "bash .ci/compose-e2e" and tests < len(commands) - 1


def test_ci_script_is_strict_bash() -> None:
    """.ci/run is an executable bash script that stops on the first failure."""
    script = ROOT / ".ci" / "run"
    lines = script.read_text().splitlines()
    assert (lines[0], "set -euo pipefail" in lines, script.stat().st_mode & 0o111 != 0) == (
        "#!/usr/bin/env bash",
        True,
        True,
    )


def _ci_function(name: str) -> str:
    """The bash source of one function defined in .ci/run."""
    text = (ROOT / ".ci" / "run").read_text()
    match = re.search(rf"^{name}\(\) {{.*?^}}$", text, re.MULTILINE | re.DOTALL)
    assert match is not None, name
    return match.group(0)


def _find_python(version: str, home: Path) -> subprocess.CompletedProcess[str]:
    """Run .ci/run's find_python with HOME=home and a PATH holding no pythonX.Y."""
    script = _ci_function("find_python") + f'\nfind_python "{version}"\n'
    return subprocess.run(
        ["bash", "-c", script],
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_ci_finds_a_pyenv_interpreter_of_each_version(tmp_path: Path) -> None:
    """A pyenv-installed 3.13 is found under ~/.pyenv/versions/3.13*/bin/python3."""
    python = tmp_path / ".pyenv" / "versions" / "3.13.7" / "bin" / "python3"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 0\n")  # answers the version check with "yes"
    python.chmod(0o755)
    result = _find_python("3.13", tmp_path)
    assert (result.returncode, result.stdout.strip()) == (0, str(python))


def test_ci_reports_a_missing_interpreter(tmp_path: Path) -> None:
    """No interpreter of the version: find_python fails, so .ci/run says so and goes on."""
    assert _find_python("3.13", tmp_path).returncode == 1


def test_ci_runs_the_client_tests_under_3_12_and_3_13() -> None:
    """.ci/run runs tests/client in a virtualenv per version, and says when one is missing."""
    text = (ROOT / ".ci" / "run").read_text()
    loop = text.split("for version in 3.12 3.13; do", 1)[1].split("\ndone\n", 1)[0]
    assert '"$python" -m venv ".venv-$version"' in loop
    assert "\".venv-$version/bin/pip\" install -e ./client -e '.[test]'" in loop
    assert '".venv-$version/bin/pytest" tests/client' in loop
    assert "is not installed here" in loop


# -- .ci/compose-e2e: the image and the topology run offline, on loopback -------------


class _ComposeLoader(yaml.SafeLoader):
    """YAML with Compose's `!reset` tag (it drops what the base file sets)."""


_ComposeLoader.add_constructor("!reset", lambda loader, node: "!reset")


def _ci_override() -> dict[str, Any]:
    text = (ROOT / ".ci" / "compose-e2e.override.yml").read_text()
    return yaml.load(text, Loader=_ComposeLoader)  # a SafeLoader, with one tag more


def test_ci_override_puts_every_default_service_on_host_networking(
    compose: dict[str, Any],
) -> None:
    """Every service `compose up` starts is overridden onto host networking, no port published."""
    services = _ci_override()["services"]
    assert sorted(services) == _default_services(compose)
    for name, service in services.items():
        assert service["network_mode"] == "host", name
        assert service.get("ports", "!reset") == "!reset", name


def test_ci_override_addresses_loopback_only() -> None:
    """Every URL and bind address in the override is 127.0.0.1."""
    text = (ROOT / ".ci" / "compose-e2e.override.yml").read_text()
    hosts = set(re.findall(r"://([^/:'\"\s]+)", text))
    binds = {_option(s["command"], "--host") for s in _ci_override()["services"].values()
             if "--host" in s.get("command", [])}  # fmt: skip
    assert hosts == {"127.0.0.1"} and binds == {"127.0.0.1"}


def test_ci_override_runs_images_built_here() -> None:
    """The override names the built images only, and no service is built by compose."""
    for name, service in _ci_override()["services"].items():
        assert service["image"].startswith("${CI_"), name
        assert name == "redis" or service["build"] == "!reset"


def test_ci_compose_script_names_no_mirror_and_pulls_nothing() -> None:
    """.ci/compose-e2e reads the mirror from apt at run time, addresses loopback, pulls never."""
    script = (ROOT / ".ci" / "compose-e2e").read_text()
    assert set(re.findall(r"https?://([^/:$\"'\s]+)", script)) <= {"127.0.0.1"}
    assert "apt_mirror.py" in script and "--pull never" in script
    assert "--bridge=none" in script and 'kill "$DOCKERD_PID"' in script


def test_apt_mirror_reads_both_source_formats(tmp_path: Path) -> None:
    """The mirror is the first deb source naming the release, deb822 or one-line."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("apt_mirror", ROOT / ".ci" / "apt_mirror.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(
        "deb-src http://src.example/debian bookworm main\n"
        "deb [arch=amd64] http://one.example/debian/ bookworm main\n"
    )
    (tmp_path / "sources.list.d" / "d.sources").write_text(
        "Types: deb\nURIs: http://two.example/debian\nSuites: trixie trixie-updates\n"
    )
    module.APT = tmp_path
    assert (module.mirror("bookworm"), module.mirror("trixie"), module.mirror("sid")) == (
        "http://one.example/debian",
        "http://two.example/debian",
        None,
    )


def test_the_compose_run_is_an_executable_bash_script() -> None:
    """.ci/compose-e2e is an executable bash script."""
    script = ROOT / ".ci" / "compose-e2e"
    assert script.read_text().startswith("#!/usr/bin/env bash\n") and script.stat().st_mode & 0o111


def _fake_commands(directory: Path, **scripts: str) -> Path:
    """A directory of executables NAME (a shell body each), to put first on PATH."""
    directory.mkdir()
    for name, body in scripts.items():
        path = directory / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return directory


def test_the_compose_run_fails_saying_why_when_the_engine_cannot_start(tmp_path: Path) -> None:
    """A dockerd that exits at start fails .ci/compose-e2e, naming the engine, with its log."""
    fakes = _fake_commands(
        tmp_path / "bin",
        id="echo 0",  # as root, which the script needs
        dockerd="echo 'failed to start daemon: no cgroup mount found' >&2; exit 1",
        docker="exit 1",
        debootstrap="exit 0",
    )
    result = subprocess.run(
        ["bash", str(ROOT / ".ci" / "compose-e2e")],
        env={"PATH": f"{fakes}:/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "the engine could not start: dockerd exited" in result.stderr
    assert "failed to start daemon: no cgroup mount found" in result.stderr
