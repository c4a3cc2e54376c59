"""Paths in what the benchmark writes: relative, so that a committed report names where its files
are without the layout of the machine that ran it (``/root/out/...``).

Invariant: a command is changed only in its paths: every absolute path becomes relative to the
directory given (the working directory of the run or the merge), and merge's ``--out-dir`` names
where the results were read; every other word stays as typed.
"""

import os
import shlex
from pathlib import Path


def relative_paths(command: str, base: Path) -> str:
    """``command`` with every absolute path in it (an argument, or an option's ``=value``) made
    relative to ``base``: a report names where its files are without the layout of the machine
    that ran it."""

    def relative(text: str) -> str:
        return os.path.relpath(text, base) if os.path.isabs(text) else text

    words = []
    for word in shlex.split(command):
        option, equals, value = word.partition("=")
        if equals and option.startswith("-"):
            words.append(f"{option}={relative(value)}")
        else:
            words.append(relative(word))
    return " ".join(shlex.quote(w) for w in words)


def located(command: str, found_in: Path, base: Path, results: str = "results.json") -> str:
    """``command`` (relative_paths) with its ``--out-dir`` naming ``found_in``, where merge read
    its results, unless the --out-dir it names already holds them (``results``, or compressed,
    ``results``.gz) relative to ``base``."""
    words = shlex.split(relative_paths(command, base))
    for i, word in enumerate(words):
        value = words[i + 1] if word == "--out-dir" and i + 1 < len(words) else None
        if word.startswith("--out-dir="):
            value = word.partition("=")[2]
        if value is None:
            continue
        held = base / value / results
        if not (held.is_file() or held.with_name(held.name + ".gz").is_file()):
            where = os.path.relpath(found_in.resolve(), base.resolve())
            words[i:i + 2] = ["--out-dir", where] if word == "--out-dir" else [f"--out-dir={where}"]
        break
    return " ".join(shlex.quote(w) for w in words)
