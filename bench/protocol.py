"""The messages between the parent and its worker processes.

Worker -> parent: one JSON object per line on stdout, after RESULT_MARKER (libraries may print
anything else there). Parent -> worker: one JSON object per line on the worker's stdin.
Invariant: every message is ``{"kind": ..., ...}`` with kind one of MESSAGE_KINDS, written with
allow_nan=False so that json.loads never sees NaN; error texts are the *last* lines of what went
wrong (a traceback's end says most). No torch here: both sides import it.
"""

import json
import sys
import traceback
from typing import Any, Dict, Iterator

RESULT_MARKER = "STREAMPOOL_BENCH "
# ready: set up, with the worker's facts; reply: the answer to one command; skipped: the
# configuration cannot run here; setup_error: it failed before any command; loaded / idle /
# probe: the co-tenant's processes.
MESSAGE_KINDS = ("ready", "reply", "skipped", "setup_error", "loaded", "idle", "probe")
ERROR_LINES = 8
ERROR_CHARS = 1200


def encode(kind: str, **fields: Any) -> str:
    if kind not in MESSAGE_KINDS:
        raise ValueError(f"unknown message kind {kind!r}")
    return RESULT_MARKER + json.dumps({"kind": kind, **fields}, allow_nan=False)


def emit(kind: str, **fields: Any) -> None:
    """One marker line on stdout for the parent."""
    print(encode(kind, **fields), flush=True)


def decode(line: str):
    """The message on ``line``, or None for a line that is not one."""
    if not line.startswith(RESULT_MARKER):
        return None
    return json.loads(line[len(RESULT_MARKER) :])


def messages(stdout: str) -> Iterator[Dict[str, Any]]:
    """The messages in a process's stdout, in order."""
    for line in stdout.splitlines():
        message = decode(line)
        if message is not None:
            yield message


def tail(text: str, lines: int = ERROR_LINES) -> str:
    """The last ``lines`` non-empty lines of ``text``, at most ERROR_CHARS characters."""
    kept = [line.rstrip() for line in text.strip().splitlines() if line.strip()][-lines:]
    joined = "\n".join(kept)
    return joined if len(joined) <= ERROR_CHARS else "..." + joined[-ERROR_CHARS:]


def error_text(exc: BaseException) -> str:
    """The last lines of ``exc``'s traceback (its type and message last)."""
    return tail("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


def progress(text: str) -> None:
    """A progress line on stderr (stdout is for results)."""
    print(text, file=sys.stderr, flush=True)
