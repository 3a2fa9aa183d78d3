"""`token-finalizer finalize` and `token-finalizer retire`: offline batches of records.

    token-finalizer finalize IN.jsonl -o OUT.jsonl (--server URL [--token T] | --config PATH)
                             [--source NAME] [--concurrency K] [--run-id ID] [--allow-bad-lines]
    token-finalizer retire OUT.jsonl (--server URL [--token T] | --config PATH) [--concurrency K]
                           [--allow-bad-lines]

`finalize` streams IN one line at a time and writes one OUT line per IN line,
in input order: the finalize answer object, or `{"line": N, "error": ...}`
for a bad line (not a JSON object, nested too deep, or refused by the
service), so nothing is dropped silently. OUT is flushed and fsynced before
the command returns; only then is it safe to run `retire`, which drops the
capture of every retirable line (masked and failed builds are never
retired) after verifying its ticket: `retire --config` needs the
`retire.key` of the finalizer that issued the tickets.

Exit status (`running`): 0 when every line was handled and none failed, 1
when the batch stopped early (OUT then holds the lines before the failure),
2 for unusable arguments or configuration, 3 when every line was handled
but some failed (bad lines, refused tickets; `--allow-bad-lines` accepts bad
lines), 130 when interrupted (the lines written so far are fsynced too).

The modules, one concept each:

    arguments    the options of both commands; the input file and target they name
    running      records through a target in input order; exit statuses
    lines        JSONL input lines parsed lazily; fsync of the output
    progress     the progress bar on stderr and the per-line messages
    finalizing   the finalize command
    retiring     the retire command
    targets      where records are finalized and retired: a service, or this process
"""

from __future__ import annotations

from token_finalizer.cli.batch.arguments import (
    FINALIZE_HELP,
    RETIRE_HELP,
    add_finalize_arguments,
    add_retire_arguments,
)
from token_finalizer.cli.batch.finalizing import finalize_command
from token_finalizer.cli.batch.retiring import retire_command

__all__ = [
    "FINALIZE_HELP",
    "RETIRE_HELP",
    "add_finalize_arguments",
    "add_retire_arguments",
    "finalize_command",
    "retire_command",
]
