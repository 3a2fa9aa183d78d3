"""`python -m token_finalizer.cli`: the same as the `token-finalizer` script."""

from __future__ import annotations

import sys

from token_finalizer.cli.main import main

sys.exit(main())
