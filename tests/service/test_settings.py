"""The YAML configuration: keys, ${VAR}, defaults, and errors naming the key."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import token_finalizer.settings
from token_finalizer._constants import (
    DEFAULT_GUARD_KEY_PREFIX,
    DEFAULT_GUARD_RUN_TTL_S,
    DEFAULT_GUARD_TIMEOUT_S,
    DEFAULT_RETIRED_TTL_S,
)
from token_finalizer.settings import (
    CONFIG_ENV_VAR,
    ConfigError,
    Settings,
    load_settings,
    settings_from_mapping,
)

CONFIG_EXAMPLE = """
token_id_capture:
  enabled: true
  all_agents: false
  agents: [swe_agent]
  max_mask_fraction: 0.2
  mask_fraction_min_samples: 50
sources:
  default: local
  local:   {kind: file, dir: ./capture}
  train-a: {kind: http, url: http://capture-store:8100, token: ${CAPTURE_TOKEN}, timeout_s: 10}
auth:
  bearer_tokens: [${FINALIZER_TOKEN}]
limits:
  max_body_bytes: 67108864
"""
ENV = {"CAPTURE_TOKEN": "store-secret", "FINALIZER_TOKEN": "finalizer-secret"}


@pytest.fixture
def design_file(tmp_path: Path) -> Path:
    """The documented configuration example as a file."""
    path = tmp_path / "finalizer.yaml"
    path.write_text(CONFIG_EXAMPLE)
    return path


def _error(data: object, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        settings_from_mapping(data, env=env or {})
    return str(caught.value)


def test_design_example_loads(design_file: Path) -> None:
    """Every key of the design's example is read into Settings."""
    settings = load_settings(design_file, env=ENV)
    capture = settings.token_id_capture
    assert (capture.all_agents, capture.agents, capture.max_mask_fraction) == (
        False,
        ("swe_agent",),
        0.2,
    )
    assert (settings.default_source, sorted(settings.sources)) == ("local", ["local", "train-a"])
    assert settings.limits.max_body_bytes == 67108864


def test_variables_are_read_from_the_environment(design_file: Path) -> None:
    """`${VAR}` values come from the environment: the source token and the bearer tokens."""
    settings = load_settings(design_file, env=ENV)
    assert (settings.sources["train-a"].token, settings.auth.bearer_tokens) == (
        "store-secret",
        ("finalizer-secret",),
    )


def test_variable_values_are_taken_literally(design_file: Path) -> None:
    """An environment value full of YAML syntax is used verbatim, never parsed as YAML."""
    settings = load_settings(design_file, env={**ENV, "FINALIZER_TOKEN": "a: [b], #c {d}"})
    assert settings.auth.bearer_tokens == ("a: [b], #c {d}",)


def test_http_source_open_options(design_file: Path) -> None:
    """An http source opens with its url, token and timeout."""
    settings = load_settings(design_file, env=ENV)
    assert settings.sources["train-a"].open_options() == {
        "url": "http://capture-store:8100",
        "token": "store-secret",
        "timeout_s": 10.0,
    }


def test_unset_variable_is_an_error_naming_the_key(design_file: Path) -> None:
    """A `${VAR}` that is not set fails, naming both the key and the variable."""
    with pytest.raises(ConfigError, match=r"sources\.train-a\.token: environment variable "):
        load_settings(design_file, env={"FINALIZER_TOKEN": "x"})


def test_no_file_runs_the_defaults() -> None:
    """Without a path or $TOKEN_FINALIZER_CONFIG: one file source `local` in ./capture."""
    settings = load_settings(None, env={})
    assert (settings.default_source, settings.sources["local"].open_options()) == (
        "local",
        {"dir": "./capture"},
    )


def test_defaults_have_no_auth_and_no_guard() -> None:
    """The defaults run without bearer tokens and without a mask-fraction guard."""
    settings = Settings()
    assert (settings.auth.bearer_tokens, settings.token_id_capture.max_mask_fraction) == ((), None)


def test_path_comes_from_the_environment_variable(design_file: Path) -> None:
    """With no path argument, $TOKEN_FINALIZER_CONFIG names the file."""
    settings = load_settings(None, env={**ENV, CONFIG_ENV_VAR: str(design_file)})
    assert "train-a" in settings.sources


def test_single_source_is_the_default() -> None:
    """A configuration with one source and no `default` uses that source."""
    settings = settings_from_mapping({"sources": {"only": {"kind": "memory"}}}, env={})
    assert settings.default_source == "only"


def test_unknown_key_is_an_error_naming_it() -> None:
    """A key that is not part of the contract fails, naming it."""
    assert "token_id_capture.max_mask_fractoin" in _error(
        {"token_id_capture": {"max_mask_fractoin": 0.2}}
    )


def test_a_bad_http_source_url_never_shows_its_password() -> None:
    """`ftp://u:SECRET@host:1` is refused naming the url with its user info masked."""
    message = _error(
        {"sources": {"default": "h", "h": {"kind": "http", "url": "ftp://u:SECRET@host:1"}}}
    )
    assert ("SECRET" in message, "must start with http://" in message) == (False, True)


@pytest.mark.parametrize(
    "url", ["http://u:SECRET@host:99999", "http://u:SECRET@host:port", "http://u:SECRET@:8100"]
)
def test_an_http_source_url_without_a_usable_host_and_port_is_refused(url: str) -> None:
    """A port out of range, not a number, or no host: refused at start, the password masked."""
    message = _error({"sources": {"default": "h", "h": {"kind": "http", "url": url}}})
    assert ("SECRET" in message, "sources.h" in message, "***@" in message) == (False, True, True)


def test_wrong_type_is_an_error_naming_the_key() -> None:
    """A value of the wrong type fails, naming its key."""
    assert "limits.max_body_bytes" in _error({"limits": {"max_body_bytes": "lots"}})


def test_fraction_out_of_range_is_an_error() -> None:
    """max_mask_fraction above 1 fails, naming the key."""
    assert "token_id_capture.max_mask_fraction" in _error(
        {"token_id_capture": {"max_mask_fraction": 1.5}}
    )


def test_default_naming_a_missing_source_is_an_error() -> None:
    """`sources.default` naming an unconfigured source fails, listing the configured ones."""
    message = _error({"sources": {"default": "remote", "local": {"kind": "memory"}}})
    assert "sources.default names 'remote'" in message
    assert "configured: local" in message


def test_file_source_without_dir_is_an_error() -> None:
    """A file source without `dir` fails, naming the source."""
    message = _error({"sources": {"local": {"kind": "file"}}})
    assert message.startswith("invalid configuration: sources.local: ")
    assert "needs `dir`" in message


def test_http_source_without_url_is_an_error() -> None:
    """An http source without `url` fails, naming the source."""
    assert "sources.remote" in _error({"sources": {"remote": {"kind": "http"}}})


def test_http_url_must_be_http() -> None:
    """An http source url without http:// or https:// fails."""
    assert "must start with http:// or https://" in _error(
        {"sources": {"remote": {"kind": "http", "url": "capture-store:8100"}}}
    )


def test_unknown_source_kind_is_an_error() -> None:
    """A source kind other than file, http or memory fails, naming the key."""
    assert "sources.local.kind" in _error({"sources": {"local": {"kind": "s3"}}})


def test_empty_bearer_token_is_refused() -> None:
    """An empty bearer token (e.g. an empty ${VAR}) fails instead of disabling auth."""
    message = _error(
        {"auth": {"bearer_tokens": ["${FINALIZER_TOKEN}"]}}, env={"FINALIZER_TOKEN": ""}
    )
    assert message.startswith("invalid configuration: auth")
    assert "empty bearer token" in message


def test_empty_source_token_is_refused() -> None:
    """An empty http source token fails: leave the key out for no token."""
    message = _error({"sources": {"remote": {"kind": "http", "url": "http://store", "token": ""}}})
    assert "`token` is empty" in message


def test_top_level_must_be_a_mapping() -> None:
    """A configuration that is a list fails, saying the top level must be a mapping."""
    assert _error([1, 2]) == "invalid configuration: the top level must be a mapping"


def test_invalid_yaml_is_an_error_naming_the_file(tmp_path: Path) -> None:
    """A file that is not YAML fails, naming the file."""
    path = tmp_path / "broken.yaml"
    path.write_text("sources: [unclosed\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml is not valid YAML"):
        load_settings(path, env={})


def test_missing_file_is_an_error_naming_it(tmp_path: Path) -> None:
    """A configuration path that does not exist fails, naming it."""
    with pytest.raises(ConfigError, match=r"cannot read configuration .*absent\.yaml"):
        load_settings(tmp_path / "absent.yaml", env={})


def test_settings_are_frozen() -> None:
    """Settings cannot be changed after validation."""
    settings = Settings()
    with pytest.raises(ValueError, match="frozen"):
        settings.default_source = "other"  # type: ignore[misc]  # the write under test


def test_environment_overrides_one_key_of_the_file(tmp_path: Path) -> None:
    """TOKEN_FINALIZER__LIMITS__MAX_BODY_BYTES overrides that key and nothing else."""
    path = tmp_path / "finalizer.yaml"
    path.write_text("limits:\n  max_body_bytes: 2048\nauth:\n  bearer_tokens: [t1]\n")
    settings = load_settings(path, env={"TOKEN_FINALIZER__LIMITS__MAX_BODY_BYTES": "1024"})
    assert (settings.limits.max_body_bytes, settings.auth.bearer_tokens) == (1024, ("t1",))


def test_environment_overrides_reach_the_embedded_default_source() -> None:
    """Without a file, an override can move the default `local` source's directory."""
    settings = load_settings(None, env={"TOKEN_FINALIZER__SOURCES__LOCAL__DIR": "/data/capture"})
    assert (settings.sources["local"].kind, settings.sources["local"].dir) == (
        "file",
        "/data/capture",
    )


def test_environment_override_lists_are_json() -> None:
    """A JSON array sets a list key (bearer tokens)."""
    env = {"TOKEN_FINALIZER__AUTH__BEARER_TOKENS": '["a", "b"]'}
    assert load_settings(None, env=env).auth.bearer_tokens == ("a", "b")


def test_invalid_environment_override_names_the_key() -> None:
    """A bad override fails like a bad file: the message names the key."""
    with pytest.raises(ConfigError, match=r"limits\.max_body_bytes"):
        load_settings(None, env={"TOKEN_FINALIZER__LIMITS__MAX_BODY_BYTES": "lots"})


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
    return names


def test_settings_import_only_the_constants_and_the_core() -> None:
    """The configuration model depends on `_constants`, its YAML reader and `core` only."""
    ours = {
        name
        for name in _imported_modules(Path(token_finalizer.settings.__file__))
        if name.split(".")[0] == "token_finalizer"
    }
    assert ours, "no import of the package was found: the check would be vacuous"
    allowed = (
        "token_finalizer._constants",
        "token_finalizer._config_yaml",
        "token_finalizer.core.",
    )
    assert sorted(name for name in ours if not name.startswith(allowed)) == []


def test_defaults_come_from_the_constants() -> None:
    """Left out, the guard's prefix, TTL and timeout and the tombstone TTL are the constants."""
    settings = settings_from_mapping(
        {"sources": {"s": {"kind": "redis", "url": "redis://r"}}}, env={}
    )
    guard = settings.guard
    assert (guard.key_prefix, guard.run_ttl_s, guard.timeout_s) == (
        DEFAULT_GUARD_KEY_PREFIX,
        DEFAULT_GUARD_RUN_TTL_S,
        DEFAULT_GUARD_TIMEOUT_S,
    )
    assert settings.sources["s"].retired_ttl_s == DEFAULT_RETIRED_TTL_S


# -- hostile configurations ---------------------------------------------------------------


def test_a_short_retire_key_is_refused_naming_it_and_how_to_make_one() -> None:
    """`retire.key: k7` (2 bytes, found offline from one ticket) is refused at start."""
    message = _error({"retire": {"key": "k7"}})
    assert message.startswith("invalid configuration: retire.key: holds 2 bytes; at least 32")
    assert "secrets.token_hex(32)" in message


def test_a_retire_key_of_32_bytes_is_accepted() -> None:
    """32 bytes of secret is the minimum; multi-byte characters count as their bytes."""
    assert settings_from_mapping({"retire": {"key": "k" * 32}}, env={}).retire.key == "k" * 32
    assert "holds 31 bytes" in _error({"retire": {"key": "é" * 15 + "k"}})


def test_a_short_retire_key_from_the_environment_is_refused_too() -> None:
    """`TOKEN_FINALIZER__RETIRE__KEY=k7` is validated like the file."""
    with pytest.raises(ConfigError, match=r"retire\.key: holds 2 bytes"):
        load_settings(None, env={"TOKEN_FINALIZER__RETIRE__KEY": "k7"})


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_non_finite_durations_are_refused_naming_the_key(tmp_path: Path, value: str) -> None:
    """`retired_ttl_s: .inf` passes `> 0` but is no duration: refused, naming the key."""
    path = tmp_path / "finalizer.yaml"
    path.write_text(
        f"sources:\n  r: {{kind: redis, url: 'redis://127.0.0.1:6379/0', retired_ttl_s: {value}}}\n"
    )
    with pytest.raises(ConfigError, match=r"sources\.r\.retired_ttl_s: .*finite number"):
        load_settings(path, env={})


@pytest.mark.parametrize(("section", "key"), [("guard", "run_ttl_s"), ("guard", "timeout_s")])
def test_durations_beyond_ten_years_are_refused(section: str, key: str) -> None:
    """A finite but absurd duration (1e300 s) would overflow a timeout or an expiry."""
    assert f"{section}.{key}" in _error({section: {key: 1e300}})


def test_an_override_switching_the_files_auth_off_is_refused(tmp_path: Path) -> None:
    """`TOKEN_FINALIZER__AUTH__BEARER_TOKENS='[]'` over a file with tokens: refused, naming it."""
    path = tmp_path / "finalizer.yaml"
    path.write_text("auth:\n  bearer_tokens: [t1]\n")
    with pytest.raises(ConfigError) as refused:
        load_settings(path, env={"TOKEN_FINALIZER__AUTH__BEARER_TOKENS": "[]"})
    assert str(refused.value).startswith(
        "environment variable TOKEN_FINALIZER__AUTH__BEARER_TOKENS switches off the "
        "auth.bearer_tokens the configuration sets"
    )


def test_an_override_of_the_whole_auth_section_switching_it_off_is_refused(
    tmp_path: Path,
) -> None:
    """`TOKEN_FINALIZER__AUTH='{"bearer_tokens": []}'` is refused the same way."""
    path = tmp_path / "finalizer.yaml"
    path.write_text("auth:\n  bearer_tokens: [t1]\n")
    env = {"TOKEN_FINALIZER__AUTH": '{"bearer_tokens": []}'}
    with pytest.raises(ConfigError, match="TOKEN_FINALIZER__AUTH switches off"):
        load_settings(path, env=env)


def test_an_override_replacing_the_tokens_keeps_auth_on(tmp_path: Path) -> None:
    """Overriding the tokens with other tokens is what overrides are for."""
    path = tmp_path / "finalizer.yaml"
    path.write_text("auth:\n  bearer_tokens: [t1]\n")
    env = {"TOKEN_FINALIZER__AUTH__BEARER_TOKENS": '["t2"]'}
    assert load_settings(path, env=env).auth.bearer_tokens == ("t2",)


def test_a_second_auth_key_in_the_file_is_refused(tmp_path: Path) -> None:
    """`auth: {}` written a second time would drop the tokens: refused, naming key and line."""
    path = tmp_path / "finalizer.yaml"
    path.write_text("auth:\n  bearer_tokens: [t1]\nauth: {}\n")
    with pytest.raises(ConfigError) as refused:
        load_settings(path, env={})
    assert str(refused.value) == (
        f"configuration {path}: key 'auth' appears twice in one mapping (line 3); "
        "the second would silently replace the first"
    )


def test_a_deeply_nested_override_is_refused() -> None:
    """A JSON override nested 20,000 deep is refused in one line, not with a traceback."""
    env = {"TOKEN_FINALIZER__TOKEN_ID_CAPTURE__AGENTS": "[" * 20_000 + "]" * 20_000}
    with pytest.raises(ConfigError, match="TOKEN_FINALIZER__TOKEN_ID_CAPTURE__AGENTS"):
        load_settings(None, env=env)


def test_a_mapping_nested_too_deep_is_refused() -> None:
    """A configuration given as data is held to the same depth bound."""
    data: dict[str, object] = {}
    node = data
    for _ in range(100):
        node["x"] = {}
        node = node["x"]  # type: ignore[assignment]  # built level by level
    assert "nests deeper than 64 levels" in _error({"token_id_capture": data})


def test_every_unset_variable_is_named_at_once() -> None:
    """Several unset `${VAR}`s fail in one error that names each key and variable."""
    data = {"retire": {"key": "${KEY_A}"}, "auth": {"bearer_tokens": ["${TOKEN_B}"]}}
    with pytest.raises(ConfigError) as refused:
        settings_from_mapping(data, env={})
    assert str(refused.value) == (
        "2 environment variables are not set: retire.key: environment variable KEY_A is not "
        "set; auth.bearer_tokens[0]: environment variable TOKEN_B is not set"
    )


def test_an_unknown_environment_override_names_its_variable() -> None:
    """An override that sets no known key fails naming the variable that set it."""
    with pytest.raises(ConfigError) as refused:
        settings_from_mapping({}, env={"TOKEN_FINALIZER__LIMIT": "3"})
    assert str(refused.value) == (
        "invalid configuration: limit: Extra inputs are not permitted "
        "(set by the environment variable TOKEN_FINALIZER__LIMIT)"
    )
