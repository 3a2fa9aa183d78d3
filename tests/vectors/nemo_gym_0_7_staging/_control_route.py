"""Gym's manifest control route: status and body per request (generator only).

The route is installed on a minimal app stub (an object with
``include_router``) and its endpoint is awaited directly; every answer is
then checked against the same route mounted on a real FastAPI app, so the
recorded status and body are what goes over the wire.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from _ledger import run_ops
from _reference import Gym

__all__ = ["control_route_cases"]

Json = Any
TOKEN = "control-secret-0123456789"


class AppStub:
    """Just enough of an app for install_rollout_control_routes."""

    def __init__(self) -> None:
        self.routers: list[Any] = []

    def include_router(self, router: Any) -> None:
        self.routers.append(router)


def setup_ops(runs: dict[str, Any]) -> list[Json]:
    """The ledger writes of two scenarios, replayed in order into one ledger."""
    ops = []
    for name in ("clean_chain", "sink_rejects"):
        for call in runs[name].case["expected"]["calls"]:
            for operation in call["ledger_ops"]:
                if operation["op"] == "record":
                    ops.append({"op": "record", "commit": operation["args"]["commit"]})
                elif operation["op"] == "record_failure":
                    ops.append({"op": "record_failure", **operation["args"]})
    return ops


async def _stub_answer(gym: Gym, endpoint: Any, rollout_id: str, headers: dict[str, str]) -> Json:
    from fastapi import HTTPException

    try:
        body = await endpoint(rollout_id=rollout_id, authorization=headers.get("Authorization"))
    except HTTPException as error:
        return {"status": error.status_code, "body": {"detail": error.detail}}
    return {"status": 200, "body": body}


def _wire_answer(app: Any, path: str, headers: dict[str, str]) -> Json:
    from fastapi.testclient import TestClient

    with TestClient(app) as client:
        response = client.get(path, headers=headers)
    return {"status": response.status_code, "body": response.json()}


async def control_route_cases(gym: Gym, runs: dict[str, Any], workdir: Path) -> Json:
    from fastapi import FastAPI

    root = workdir / "control-route"
    ops = setup_ops(runs)
    await run_ops(gym, "file", root, ops)
    ledger = gym.lineage.FileLineageStore(root)
    stub = AppStub()
    gym.control.install_rollout_control_routes(stub, ledger, auth_token=TOKEN)
    route = stub.routers[0].routes[0]
    real = FastAPI()
    gym.control.install_rollout_control_routes(real, ledger, auth_token=TOKEN)
    clean = runs["clean_chain"].case["inputs"]["rollout_id"]
    failed = runs["sink_rejects"].case["inputs"]["rollout_id"]
    good = {"Authorization": f"Bearer {TOKEN}"}
    specs: list[tuple[str, str, str, dict[str, str]]] = [
        ("no_header", "No Authorization header.", clean, {}),
        ("wrong_token", "Another bearer token.", clean, {"Authorization": "Bearer not-it"}),
        (
            "lowercase_bearer",
            "The scheme must be exactly 'Bearer'.",
            clean,
            {"Authorization": f"bearer {TOKEN}"},
        ),
        (
            "double_space",
            "Two spaces after the scheme.",
            clean,
            {"Authorization": f"Bearer  {TOKEN}"},
        ),
        ("token_without_scheme", "The bare token.", clean, {"Authorization": TOKEN}),
        ("basic_scheme", "Another scheme.", clean, {"Authorization": f"Basic {TOKEN}"}),
        (
            "trailing_space",
            "A trailing space after the token.",
            clean,
            {"Authorization": f"Bearer {TOKEN} "},
        ),
        ("manifest", "The clean chain's manifest.", clean, good),
        ("manifest_with_failures", "A poisoned rollout's manifest.", failed, good),
        ("unknown_rollout", "A rollout without rows: empty lists.", "rollout-never-seen", good),
        ("bad_rollout_id_space", "A space is outside [A-Za-z0-9._-].", "bad id", good),
        ("bad_rollout_id_non_ascii", "Non-ASCII letters are refused.", "rollout-é", good),
        ("bad_rollout_id_without_auth", "Authentication is checked first.", "bad id", {}),
    ]
    cases = []
    for name, description, rollout_id, headers in specs:
        path = f"{route.path}".replace("{rollout_id}", quote(rollout_id, safe=""))
        answer = await _stub_answer(gym, route.endpoint, rollout_id, headers)
        wire = _wire_answer(real, path, headers)
        if wire != answer:
            raise AssertionError(f"{name}: stub {answer} != wire {wire}")
        cases.append(
            {
                "name": name,
                "description": description,
                "inputs": {"rollout_id": rollout_id, "path": path, "headers": headers},
                "expected": answer,
            }
        )
    try:
        gym.control.install_rollout_control_routes(AppStub(), ledger, auth_token="")
        refused: Json = None
    except ValueError as error:
        refused = {"class": "ValueError", "message": str(error)}
    return {
        "auth_token": TOKEN,
        "route": route.path,
        "ledger_setup": ops,
        "empty_token_install": refused,
        "cases": cases,
    }
