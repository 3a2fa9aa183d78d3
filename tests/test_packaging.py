"""The client is a distribution of its own: installed alone, it brings no server code and is typed.

One test, run in CI like every other (it takes about half a minute): a fresh
virtualenv, `pip install ./client` from this checkout (its dependencies come
from PyPI), then a probe in that virtualenv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Run by the fresh virtualenv's python, from a directory outside the checkout.
_PROBE = """
import importlib.metadata, importlib.util, json, sys
import token_finalizer_client
server_side = ("token_finalizer", "fastapi", "uvicorn", "starlette", "pydantic", "numpy")
print(json.dumps({
    "location": token_finalizer_client.__file__,
    "importable": sorted(name for name in server_side if importlib.util.find_spec(name)),
    "loaded": sorted(name for name in sys.modules if name.split(".")[0] in server_side),
    "requires": importlib.metadata.requires("token-finalizer-client"),
}))
"""
# What a type checker asks: does the installed package carry the PEP 561 marker?
_TYPED = (
    "import importlib.resources as r; "
    "print(r.files('token_finalizer_client').joinpath('py.typed').is_file())"
)


def _run(command: list[str], cwd: Path) -> str:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.timeout(600)
def test_client_installs_alone_without_server_code_and_typed(tmp_path: Path) -> None:
    """`pip install ./client` in a fresh venv: importable, no server packages, py.typed shipped."""
    # The checkout's client/ as it is, copied so that the build's own files
    # (build/, *.egg-info) land in the copy, not in the working tree.
    client = shutil.copytree(
        ROOT / "client",
        tmp_path / "client",
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    python = str(venv / "bin" / "python")
    _run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(client)],
        cwd=tmp_path,
    )
    probe = json.loads(_run([python, "-c", _PROBE], cwd=tmp_path))
    typed = _run([python, "-c", _TYPED], cwd=tmp_path).strip()
    requires = sorted(requirement.split(">")[0].split(";")[0] for requirement in probe["requires"])
    assert Path(probe["location"]).is_relative_to(venv)
    assert (probe["importable"], probe["loaded"], typed) == ([], [], "True")
    assert requires == [
        "aiohttp",
        "httpx",
        "numpy",
        "opentelemetry-api",
        "opentelemetry-exporter-otlp-proto-http",
        "opentelemetry-sdk",
        "orjson",
        "sniffio",
        "stamina",
        "zstandard",
    ]
    # Only the trace API is a dependency: the SDK and its exporter are the `otel` extra.
    assert [r for r in probe["requires"] if "extra" in r] == [
        'orjson>=3.9; extra == "fast"',
        'numpy>=1.26; extra == "fast"',
        'opentelemetry-sdk>=1.45; extra == "otel"',
        'opentelemetry-exporter-otlp-proto-http>=1.45; extra == "otel"',
    ]


@pytest.mark.timeout(300)
def test_service_wheel_carries_the_redis_scripts(tmp_path: Path) -> None:
    """The service wheel (what the image installs) holds every Lua script the redis store uses."""
    import zipfile

    from token_finalizer.sources.redis._scripts import SCRIPT_NAMES

    source = tmp_path / "src"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(".venv", ".git", "*.egg-info", "build", "__pycache__"),
    )
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps"]
    _run([*pip, "-q", "-w", str(tmp_path / "dist"), str(source)], cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("token_finalizer-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {f"token_finalizer/sources/redis/scripts/{n}.lua" for n in (*SCRIPT_NAMES, "prelude")}
    assert wanted <= names
