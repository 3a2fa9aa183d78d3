"""The service configuration: one YAML file, validated into one Settings object.

The path comes from `--config` or `TOKEN_FINALIZER_CONFIG`; `${VAR}` inside any
string value is read from the environment. With no file the defaults run: one
`file` source named `local` in `./capture`. An invalid file fails at start-up
with a message naming the offending key; so does a file with a key twice in
one mapping, nested too deep or expanding to too many values (`_config_yaml`),
and an environment override that would switch the file's auth off.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from token_finalizer._config_yaml import (
    ConfigShapeError,
    check_shape,
    load_config_yaml,
    yaml_problem,
)
from token_finalizer._constants import (
    DEFAULT_CAPTURE_DIR,
    DEFAULT_GUARD_KEY_PREFIX,
    DEFAULT_GUARD_RUN_TTL_S,
    DEFAULT_GUARD_TIMEOUT_S,
    DEFAULT_HTTP_TIMEOUT_S,
    DEFAULT_MASK_FRACTION_MIN_SAMPLES,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MEMORY_HIGH_WATER,
    DEFAULT_ON_UNREACHABLE,
    DEFAULT_RETIRED_TTL_S,
    DEFAULT_SOURCE_NAME,
    MAX_SETTING_SECONDS,
    MIN_RETIRE_KEY_BYTES,
)
from token_finalizer.core.redaction import redact
from token_finalizer.core.store_urls import check_key_prefix, check_redis_seeds, check_redis_url

__all__ = [
    "CONFIG_ENV_VAR",
    "AuthSettings",
    "ConfigError",
    "GuardSettings",
    "LimitsSettings",
    "RedisSettings",
    "Settings",
    "SourceSettings",
    "TokenIdCaptureSettings",
    "load_settings",
    "settings_from_mapping",
]

CONFIG_ENV_VAR = "TOKEN_FINALIZER_CONFIG"
# Any single key can be overridden from the environment, as containers expect:
# TOKEN_FINALIZER__LIMITS__MAX_BODY_BYTES=1048576 sets limits.max_body_bytes.
# Prefix and nesting delimiter are documented in docs/configuration.md#environment.
OVERRIDE_PREFIX = "TOKEN_FINALIZER__"
OVERRIDE_DELIMITER = "__"
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# `${VAR}` is not valid YAML inside a flow collection (`{token: ${X}}`, `[${X}]`):
# the braces are flow indicators. Variables are swapped for plain placeholders
# before parsing and restored after, so they are still interpolated per key.
_PLACEHOLDER = re.compile(r"__token_finalizer_var_([A-Za-z_][A-Za-z0-9_]*)__")


class ConfigError(ValueError):
    """An invalid configuration; the message names the key."""


class _Strict(BaseModel):
    # No infinity or NaN anywhere: `.inf` seconds pass `> 0` and then overflow
    # a socket timeout or a Redis expiry at start-up.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TokenIdCaptureSettings(_Strict):
    enabled: bool = True
    all_agents: bool = True
    agents: tuple[str, ...] = ()
    max_mask_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    mask_fraction_min_samples: int = Field(default=DEFAULT_MASK_FRACTION_MIN_SAMPLES, ge=1)
    # Which call the verifier scored decides the delivered chain; false keeps the
    # seed's strict single-chain rules (docs/configuration.md).
    terminal_attribution: bool = True

    def takes_part(self, record: Mapping[str, Any]) -> bool:
        """Whether this record's agent (agent_ref.name) is finalized at all."""
        if not self.enabled:
            return False
        if self.all_agents:
            return True
        agent = record.get("agent_ref")
        name = agent.get("name") if isinstance(agent, Mapping) else None
        return isinstance(name, str) and name in self.agents


def _redis_urls(url: str | None, urls: tuple[str, ...] | None) -> tuple[str, ...]:
    """The one URL, or the seed list, of a redis connection (exactly one of them given)."""
    if url is not None and urls is not None:
        raise ValueError("give `url` or `urls` (a cluster's seed nodes), not both")
    if urls is not None:
        if not urls:
            raise ValueError("`urls` is empty; name at least one seed node")
        return urls
    return (check_redis_url(url),)


class RedisSettings(_Strict):
    """How the guard reaches its Redis: one server, or a Redis Cluster from its seeds."""

    url: str | None = None
    urls: tuple[str, ...] | None = None
    cluster: bool = False
    min_replicas_acked: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _reachable(self) -> RedisSettings:
        check_redis_seeds(_redis_urls(self.url, self.urls), cluster=self.cluster)
        return self

    @property
    def seeds(self) -> tuple[str, ...]:
        """The URL, or the seed nodes."""
        return _redis_urls(self.url, self.urls)


def _check_http_host(url: str) -> None:
    """ValueError unless `url` names a host and, if any, a port in [1, 65535].

    Such a typo otherwise starts, and masks every record with an error that
    names no setting; the message never shows the URL's password.
    """
    shown = redact(url)
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = 0
    if not parts.hostname:
        raise ValueError(f"url {shown!r} names no host")
    if port == 0:
        raise ValueError(f"url {shown!r} has a port that is not a number in [1, 65535]")


class SourceSettings(_Strict):
    kind: Literal["file", "http", "memory", "redis"]
    dir: str | None = None
    url: str | None = None
    token: str | None = None
    timeout_s: float = Field(default=DEFAULT_HTTP_TIMEOUT_S, gt=0, le=MAX_SETTING_SECONDS)
    # redis only: prefix of every key, and how long retired tombstones and
    # never-frozen captures nobody writes to are kept (null: forever).
    key_prefix: str | None = None
    # redis only: a Redis Cluster reached through `url` or the seed nodes `urls`,
    # and replicas every state change waits for (docs/configuration.md#sources).
    urls: tuple[str, ...] | None = None
    cluster: bool = False
    min_replicas_acked: int = Field(default=0, ge=0)
    retired_ttl_s: float | None = Field(default=DEFAULT_RETIRED_TTL_S, gt=0, le=MAX_SETTING_SECONDS)
    abandoned_ttl_s: float | None = Field(default=None, gt=0, le=MAX_SETTING_SECONDS)
    # redis only: capture writes refused (507) above this share of maxmemory (null:
    # never), and an evicting maxmemory-policy accepted (docs/capacity.md).
    memory_high_water: float | None = Field(default=DEFAULT_MEMORY_HIGH_WATER, gt=0, le=1)
    allow_eviction: bool = False
    # A store that cannot be reached: answer 503 so the harness retries (nothing
    # was frozen), or mask the record. docs/configuration.md#sources
    on_unreachable: Literal["retry", "mask"] = DEFAULT_ON_UNREACHABLE
    # Whose receipt policy decides a staging rollout's terminal and poisoning: ours, or
    # NeMo RL's where it differs cheaply (docs/staging.md#nemo-rls-receipt-policy).
    receipt_policy: Literal["token_finalizer", "nemo_rl"] = "token_finalizer"

    @model_validator(mode="after")
    def _kind_needs(self) -> SourceSettings:
        if self.kind == "file" and not self.dir:
            raise ValueError("a file source needs `dir`")
        if self.kind == "http":
            if not self.url:
                raise ValueError("an http source needs `url`")
            if not self.url.startswith(("http://", "https://")):
                # Redacted: this line is printed at start-up (issue 29).
                shown = redact(self.url)
                raise ValueError(f"url {shown!r} must start with http:// or https://")
            _check_http_host(self.url)
        if self.kind == "redis":
            check_redis_seeds(_redis_urls(self.url, self.urls), cluster=self.cluster)
            if self.key_prefix is not None:
                check_key_prefix(self.key_prefix)
            if self.token is not None:
                raise ValueError("a redis source takes no `token`; put credentials in `url`")
        elif self.urls is not None or self.cluster or self.min_replicas_acked:
            raise ValueError("`urls`, `cluster` and `min_replicas_acked` are for redis sources")
        elif self.allow_eviction or "memory_high_water" in self.model_fields_set:
            raise ValueError("`memory_high_water` and `allow_eviction` are for redis sources")
        if self.token == "":
            raise ValueError("`token` is empty; leave it out for no token")
        return self

    def open_options(self) -> dict[str, Any]:
        """Keyword arguments of `sources.open_source` for this kind."""
        if self.kind == "file":
            return {"dir": self.dir}
        if self.kind == "http":
            return {"url": self.url, "token": self.token, "timeout_s": self.timeout_s}
        if self.kind == "redis":
            return {
                "urls": _redis_urls(self.url, self.urls),
                "cluster": self.cluster,
                "min_replicas_acked": self.min_replicas_acked,
                "key_prefix": self.key_prefix,
                "timeout_s": self.timeout_s,
                "retired_ttl_s": self.retired_ttl_s,
                "abandoned_ttl_s": self.abandoned_ttl_s,
                "memory_high_water": self.memory_high_water,
                "allow_eviction": self.allow_eviction,
            }
        return {}


class AuthSettings(_Strict):
    bearer_tokens: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _no_empty_tokens(self) -> AuthSettings:
        if any(not token for token in self.bearer_tokens):
            raise ValueError(
                "an empty bearer token would mean 'no auth' by accident; "
                "remove auth.bearer_tokens to run without auth"
            )
        return self


class RetireSettings(_Strict):
    # HMAC key of retire tickets; the same secret on every replica and worker.
    key: str | None = None

    @field_validator("key")
    @classmethod
    def _long_enough(cls, key: str | None) -> str | None:
        if key is None:
            return None
        if not key:
            raise ValueError("is empty; leave it out to use a per-process key")
        size = len(key.encode())
        if size < MIN_RETIRE_KEY_BYTES:
            # One genuine ticket lets anyone search a short key offline.
            raise ValueError(
                f"holds {size} bytes; at least {MIN_RETIRE_KEY_BYTES} bytes of secret are "
                "required (make one with: python3 -c 'import secrets; "
                "print(secrets.token_hex(32))')"
            )
        return key


class GuardSettings(_Strict):
    # Where the per-run mask-fraction counts live: a Redis URL (or a mapping: url
    # or urls, cluster, min_replicas_acked) shares them between every worker and
    # replica; null keeps them in each process (docs/configuration.md#guard).
    redis: RedisSettings | None = None
    # Prefix of the guard's keys (one hash per run: `<prefix>run:<run id>`).
    key_prefix: str = DEFAULT_GUARD_KEY_PREFIX
    # A run's counts expire this long after its last counted finalize (sliding).
    run_ttl_s: float = Field(default=DEFAULT_GUARD_RUN_TTL_S, gt=0, le=MAX_SETTING_SECONDS)
    # Each Redis operation's deadline, retries included; past it the finalize goes on
    # unguarded (fail open).
    timeout_s: float = Field(default=DEFAULT_GUARD_TIMEOUT_S, gt=0, le=MAX_SETTING_SECONDS)

    @field_validator("redis", mode="before")
    @classmethod
    def _redis_url(cls, redis: Any) -> Any:
        # The short form: `guard.redis: redis://host:6379/0`.
        return {"url": redis} if isinstance(redis, str) else redis

    @field_validator("key_prefix")
    @classmethod
    def _key_prefix(cls, prefix: str) -> str:
        return check_key_prefix(prefix)


class LimitsSettings(_Strict):
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, gt=0)


def _default_sources() -> dict[str, SourceSettings]:
    return {DEFAULT_SOURCE_NAME: SourceSettings(kind="file", dir=DEFAULT_CAPTURE_DIR)}


class Settings(_Strict):
    """Everything the service reads from its configuration."""

    token_id_capture: TokenIdCaptureSettings = TokenIdCaptureSettings()
    default_source: str = DEFAULT_SOURCE_NAME
    sources: dict[str, SourceSettings] = Field(default_factory=_default_sources)
    auth: AuthSettings = AuthSettings()
    limits: LimitsSettings = LimitsSettings()
    retire: RetireSettings = RetireSettings()
    guard: GuardSettings = GuardSettings()

    @model_validator(mode="before")
    @classmethod
    def _split_default(cls, data: Any) -> Any:
        # In YAML `sources.default` names the default beside the sources themselves.
        if isinstance(data, dict) and isinstance(data.get("sources"), dict):
            data = dict(data)
            sources = dict(data["sources"])
            if "default" in sources:
                data["default_source"] = sources.pop("default")
            elif len(sources) == 1:
                data.setdefault("default_source", next(iter(sources)))
            data["sources"] = sources
        return data

    def sources_on_unreachable(self, name: str) -> str:
        """`on_unreachable` of a configured source (sources given in code take the default)."""
        source = self.sources.get(name)
        return DEFAULT_ON_UNREACHABLE if source is None else source.on_unreachable

    def sources_receipt_policy(self, name: str) -> str:
        """`receipt_policy` of a configured source (sources given in code take ours)."""
        source = self.sources.get(name)
        return "token_finalizer" if source is None else source.receipt_policy

    @model_validator(mode="after")
    def _default_exists(self) -> Settings:
        if not self.sources:
            raise ValueError("sources: at least one source must be configured")
        if self.default_source not in self.sources:
            raise ValueError(
                f"sources.default names {self.default_source!r}, which is not configured "
                f"(configured: {', '.join(sorted(self.sources))})"
            )
        return self


def _interpolate(value: Any, env: Mapping[str, str], where: str) -> Any:
    """`value` with every `${VAR}` replaced; ConfigError naming every one that is not set."""
    missing: list[str] = []
    result = _substitute(value, env, where, missing)
    if len(missing) == 1:
        raise ConfigError(missing[0])
    if missing:
        raise ConfigError(f"{len(missing)} environment variables are not set: {'; '.join(missing)}")
    return result


def _substitute(value: Any, env: Mapping[str, str], where: str, missing: list[str]) -> Any:
    """`value` with every set `${VAR}` replaced; each unset one appended to `missing`."""
    if isinstance(value, str):

        def lookup(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                missing.append(f"{where}: environment variable {name} is not set")
                return match.group(0)
            return env[name]

        return _VARIABLE.sub(lookup, value)
    if isinstance(value, dict):
        return {
            k: _substitute(v, env, f"{where}.{k}" if where else str(k), missing)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_substitute(v, env, f"{where}[{i}]", missing) for i, v in enumerate(value)]
    return value


def _hide_variables(text: str) -> str:
    return _VARIABLE.sub(lambda match: f"__token_finalizer_var_{match.group(1)}__", text)


def _restore_variables(value: Any) -> Any:
    if isinstance(value, str):
        return _PLACEHOLDER.sub(lambda match: f"${{{match.group(1)}}}", value)
    if isinstance(value, dict):
        return {_restore_variables(k): _restore_variables(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore_variables(v) for v in value]
    return value


def _describe(
    error: ValidationError, overrides: Mapping[tuple[str, ...], str] | None = None
) -> str:
    """The validation problems in words; a key an environment override set names its variable."""
    problems = []
    for item in error.errors():
        parts = [str(part) for part in item["loc"]]
        location = ".".join(parts) or "(top level)"
        location = location.replace("default_source", "sources.default")
        message = item["msg"].removeprefix("Value error, ")
        variable = _override_naming(parts, overrides or {})
        origin = f" (set by the environment variable {variable})" if variable else ""
        problems.append(f"{location}: {message}{origin}")
    return "invalid configuration: " + "; ".join(problems)


def _override_naming(location: list[str], overrides: Mapping[tuple[str, ...], str]) -> str | None:
    """The override variable that set the key at `location` (model tags in it skipped)."""
    for path, name in overrides.items():
        if location and location[-1] == path[-1] and all(part in location for part in path):
            return name
    return None


def _override_paths(env: Mapping[str, str]) -> dict[tuple[str, ...], str]:
    """Each `TOKEN_FINALIZER__A__B` variable by the key path `("a", "b")` it sets."""
    return {
        tuple(part.lower() for part in name[len(OVERRIDE_PREFIX) :].split(OVERRIDE_DELIMITER)): name
        for name in env
        if name.startswith(OVERRIDE_PREFIX)
    }


def _override_value(name: str, text: str) -> Any:
    # Lists and mappings (`["a","b"]`, `{"kind": "file"}`) are read as JSON; any
    # other value stays a string and is converted by the field's own type.
    if text.startswith(("[", "{")):
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            raise ConfigError(f"environment override {name} is not valid JSON") from None
        try:
            check_shape(value, what=f"environment override {name}")
        except ConfigShapeError as exc:
            raise ConfigError(str(exc)) from None
        return value
    return text


def _environment_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    """`TOKEN_FINALIZER__A__B=v` variables as the nested mapping `{"a": {"b": v}}`."""
    overrides: dict[str, Any] = {}
    for name, text in env.items():
        if not name.startswith(OVERRIDE_PREFIX):
            continue
        path = [part.lower() for part in name[len(OVERRIDE_PREFIX) :].split(OVERRIDE_DELIMITER)]
        if not all(path):
            raise ConfigError(f"environment override {name}: an empty key in the path")
        node = overrides
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"environment override {name}: {part} is set as a value too")
            node = child
        node[path[-1]] = _override_value(name, text)
    return overrides


_AUTH_OVERRIDE = f"{OVERRIDE_PREFIX}AUTH"


def _bearer_tokens(data: Any) -> Any:
    auth = data.get("auth") if isinstance(data, dict) else None
    return auth.get("bearer_tokens") if isinstance(auth, dict) else None


def _check_auth_kept(data: Any, merged: Any, env: Mapping[str, str]) -> None:
    """ConfigError when environment overrides switch off the auth the file turns on.

    `TOKEN_FINALIZER__AUTH__BEARER_TOKENS='[]'` left in a container's
    environment would otherwise open the service silently.
    """
    if not _bearer_tokens(data) or _bearer_tokens(merged):
        return
    names = sorted(name for name in env if name.upper().startswith(_AUTH_OVERRIDE))
    raise ConfigError(
        f"environment variable {', '.join(names)} switches off the auth.bearer_tokens the "
        "configuration sets; unset it (to run without auth, remove auth from the configuration)"
    )


def _merged(base: Any, overrides: Mapping[str, Any]) -> Any:
    if not isinstance(base, dict):
        return dict(overrides)
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def settings_from_mapping(data: Any, env: Mapping[str, str] | None = None) -> Settings:
    """Validate an already-parsed configuration (interpolating `${VAR}`, then applying
    `TOKEN_FINALIZER__...` overrides from `env`)."""
    env = os.environ if env is None else env
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("invalid configuration: the top level must be a mapping")
    try:
        check_shape(data)
    except ConfigShapeError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from None
    interpolated = _interpolate(data, env, "")
    data = _merged(interpolated, _environment_overrides(env))
    _check_auth_kept(interpolated, data, env)
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, _override_paths(env))) from None


def load_settings(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Load the configuration file (`path`, else $TOKEN_FINALIZER_CONFIG, else defaults)."""
    env = os.environ if env is None else env
    if path is None:
        path = env.get(CONFIG_ENV_VAR) or None
    if path is None:
        # The embedded default, spelled out so that overrides can address it
        # (TOKEN_FINALIZER__SOURCES__LOCAL__DIR=/data).
        default = {"kind": "file", "dir": DEFAULT_CAPTURE_DIR}
        return settings_from_mapping({"sources": {DEFAULT_SOURCE_NAME: default}}, env)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read configuration {path}: {exc.strerror or exc}") from None
    try:
        data = _restore_variables(load_config_yaml(_hide_variables(text)))
    except yaml.YAMLError as exc:
        raise ConfigError(f"configuration {path} is not valid YAML: {yaml_problem(exc)}") from None
    except ConfigShapeError as exc:
        raise ConfigError(f"configuration {path}: {exc}") from None
    return settings_from_mapping(data, env)
