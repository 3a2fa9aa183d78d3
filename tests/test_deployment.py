"""Static checks of the Dockerfile and docker-compose.yml (no Docker engine runs here).

The files must agree with the code: their commands parse with the real CLI,
their ports and health paths are the ones the servers listen on and serve.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from token_finalizer.api import create_app
from token_finalizer.cli import build_parser
from token_finalizer.settings import Settings, settings_from_mapping
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
    assert test[:3] == ["CMD", "python", "-c"] or test[:2] == ["python", "-c"]
    code = test[-1]
    assert "urllib.request.urlopen" in code
    match = _HEALTH_URL.search(code)
    assert match is not None
    return urlsplit(match.group(1))


def _finalizer_paths() -> set[str]:
    return set(create_app(Settings()).openapi()["paths"])


def _store_paths() -> set[str]:
    return set(create_store_app(MemoryTokenStore()).openapi()["paths"])


def _compose_config(compose: dict[str, Any]) -> Settings:
    """The finalizer's inline configuration as the container sees it (`$$` -> `$`)."""
    content = compose["configs"]["finalizer-config"]["content"].replace("$$", "$")
    env = {"CAPTURE_TOKEN": "store-token", "FINALIZER_TOKEN": "finalizer-token"}
    return settings_from_mapping(yaml.safe_load(content), env=env)


# -- docker-compose.yml -------------------------------------------------------


def test_compose_has_the_finalizer_and_a_capture_store(compose: dict[str, Any]) -> None:
    """The compose file defines exactly the finalizer and the capture store services."""
    assert sorted(compose["services"]) == ["capture-store", "finalizer"]


def test_store_command_is_the_cli_store_serve(compose: dict[str, Any]) -> None:
    """The store runs `token-finalizer store serve --dir /data` on 0.0.0.0:8100."""
    command = compose["services"]["capture-store"]["command"]
    args = build_parser().parse_args(command[1:])
    assert (command[0], args._run.__name__, str(args.dir), args.host, args.port) == (
        "token-finalizer",
        "store_serve",
        "/data",
        "0.0.0.0",
        8100,
    )


def test_finalizer_command_is_the_cli_serve(compose: dict[str, Any]) -> None:
    """The finalizer runs `token-finalizer serve` with the mounted config, on 0.0.0.0."""
    service = compose["services"]["finalizer"]
    args = build_parser().parse_args(service["command"][1:])
    mounted = [config["target"] for config in service["configs"]]
    assert (args._run.__name__, args.host, [args.config]) == ("serve", "0.0.0.0", mounted)


def test_store_volume_is_named_and_mounted_at_the_served_dir(compose: dict[str, Any]) -> None:
    """The store's /data (its --dir) is a named volume declared at the top level."""
    store = compose["services"]["capture-store"]
    volume, _, target = store["volumes"][0].partition(":")
    assert (volume in compose["volumes"], target) == (True, _option(store["command"], "--dir"))


@pytest.mark.parametrize("name", ["capture-store", "finalizer"])
def test_published_port_is_the_served_port(compose: dict[str, Any], name: str) -> None:
    """Each service publishes the port its command listens on."""
    service = compose["services"][name]
    container_port = service["ports"][0].rsplit(":", 1)[1]
    assert container_port == _option(service["command"], "--port")


@pytest.mark.parametrize("name", ["capture-store", "finalizer"])
def test_healthcheck_probes_the_served_port(compose: dict[str, Any], name: str) -> None:
    """Each healthcheck probes, with python's urllib, the port its command listens on."""
    service = compose["services"][name]
    url = _health_url(service["healthcheck"]["test"])
    assert str(url.port) == _option(service["command"], "--port")


def test_finalizer_healthcheck_path_is_served(compose: dict[str, Any]) -> None:
    """The finalizer's healthcheck path is a route of the finalizer API."""
    url = _health_url(compose["services"]["finalizer"]["healthcheck"]["test"])
    assert url.path in _finalizer_paths()


def test_store_healthcheck_path_is_served(compose: dict[str, Any]) -> None:
    """The store's healthcheck path is a route of the capture-store app."""
    url = _health_url(compose["services"]["capture-store"]["healthcheck"]["test"])
    assert url.path in _store_paths()


def test_finalizer_waits_for_a_healthy_store(compose: dict[str, Any]) -> None:
    """The finalizer depends on the capture store being healthy."""
    depends = compose["services"]["finalizer"]["depends_on"]
    assert depends == {"capture-store": {"condition": "service_healthy"}}


def test_finalizer_config_is_valid(compose: dict[str, Any]) -> None:
    """The inline finalizer configuration passes the service's own validation."""
    settings = _compose_config(compose)
    assert (settings.default_source, settings.auth.bearer_tokens) == ("store", ("finalizer-token",))


def test_finalizer_config_points_at_the_store_service(compose: dict[str, Any]) -> None:
    """The finalizer's http source names the store service and its served port."""
    url = urlsplit(_compose_config(compose).sources["store"].url or "")
    store_port = _option(compose["services"]["capture-store"]["command"], "--port")
    assert (url.hostname, str(url.port)) == ("capture-store", store_port)


def test_finalizer_gets_every_variable_its_config_reads(compose: dict[str, Any]) -> None:
    """Every ${VAR} of the inline config is set in the finalizer's environment."""
    content = compose["configs"]["finalizer-config"]["content"]
    wanted = set(re.findall(r"\$\$\{([A-Za-z_][A-Za-z0-9_]*)\}", content))
    assert wanted <= set(compose["services"]["finalizer"]["environment"])


def test_store_and_finalizer_share_the_capture_token(compose: dict[str, Any]) -> None:
    """The store's token and the finalizer's CAPTURE_TOKEN come from the same variable."""
    services = compose["services"]
    store_token = services["capture-store"]["environment"]["TOKEN_FINALIZER_STORE_TOKEN"]
    assert store_token == services["finalizer"]["environment"]["CAPTURE_TOKEN"]


def test_finalizer_may_finish_in_flight_requests(compose: dict[str, Any]) -> None:
    """The stop grace period outlasts the server's graceful shutdown."""
    from token_finalizer._constants import GRACEFUL_SHUTDOWN_S

    grace = compose["services"]["finalizer"]["stop_grace_period"]
    assert int(grace.removesuffix("s")) > GRACEFUL_SHUTDOWN_S


# -- Dockerfile ---------------------------------------------------------------


def test_dockerfile_uses_a_slim_python_base(dockerfile: list[str]) -> None:
    """Every stage builds FROM a slim Python image."""
    bases = [line.split()[0] for line in _instruction(dockerfile, "FROM")]
    assert bases and all(re.fullmatch(r"python:3\.\d+-slim", base) for base in bases)


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
    """The build copies the service and client packages and installs the project."""
    copied = " ".join(_instruction(dockerfile, "COPY"))
    runs = " ".join(_instruction(dockerfile, "RUN"))
    assert ("service" in copied, "client" in copied, "pip install /src" in runs) == (
        True,
        True,
        True,
    )


def test_dockerfile_user_owns_the_data_directory(dockerfile: list[str]) -> None:
    """The directory the store volume mounts on is created owned by the service user."""
    runs = " ".join(_instruction(dockerfile, "RUN"))
    install = next(part for part in runs.split("&&") if "install -d" in part)
    assert ("/data" in shlex.split(install), "-o finalizer" in install) == (True, True)


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


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run ends with the README's test command, verbatim."""
    lines = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert lines[-1] == _setup_commands()[1]


def test_ci_script_is_strict_bash() -> None:
    """.ci/run is an executable bash script that stops on the first failure."""
    script = ROOT / ".ci" / "run"
    lines = script.read_text().splitlines()
    assert (lines[0], "set -euo pipefail" in lines, script.stat().st_mode & 0o111 != 0) == (
        "#!/usr/bin/env bash",
        True,
        True,
    )
