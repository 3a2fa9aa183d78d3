"""The command line: `serve`, `store serve|sweep`, `finalize`, `retire` (wired in `main`)."""

from __future__ import annotations

from token_finalizer.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
