"""How a child process tells the parent what it measured: one JSON object per marker line on stdout.

Invariant: only lines starting with RESULT_MARKER carry results (libraries may print anything
else); every message is ``{"kind": ..., ...}`` with kind one of MESSAGE_KINDS, written with
allow_nan=False so the parent's json.loads never sees NaN. No torch here: both sides import it.
"""

import json
import sys
from typing import Any, Dict, Iterator

RESULT_MARKER = "STREAMPOOL_BENCH "
# info: the child's facts; workload: one record; skipped: the configuration cannot run here;
# setup_error: it failed before any workload; ready / fit: the co-tenant's two processes.
MESSAGE_KINDS = ("info", "workload", "skipped", "setup_error", "ready", "fit")
ERROR_TEXT_CHARS = 600


def emit(kind: str, **fields: Any) -> None:
    """One marker line on stdout for the parent."""
    if kind not in MESSAGE_KINDS:
        raise ValueError(f"unknown message kind {kind!r}")
    print(RESULT_MARKER + json.dumps({"kind": kind, **fields}, allow_nan=False), flush=True)


def messages(stdout: str) -> Iterator[Dict[str, Any]]:
    """The messages in a child's stdout, in order."""
    for line in stdout.splitlines():
        if line.startswith(RESULT_MARKER):
            yield json.loads(line[len(RESULT_MARKER) :])


def tail(text: str) -> str:
    """The last ERROR_TEXT_CHARS characters of ``text`` (a log: the end says most), stripped."""
    text = text.strip()
    return text if len(text) <= ERROR_TEXT_CHARS else "..." + text[-ERROR_TEXT_CHARS:]


def exception_text(exc: BaseException) -> str:
    """``Type: message``, cut to ERROR_TEXT_CHARS (the start of a message says most)."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= ERROR_TEXT_CHARS else text[:ERROR_TEXT_CHARS] + "..."


def progress(text: str) -> None:
    """A progress line on stderr (stdout is for results)."""
    print(text, file=sys.stderr, flush=True)
