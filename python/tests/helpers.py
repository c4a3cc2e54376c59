"""Helpers shared by the tests: running Python snippets in a fresh process."""

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

PYTHON_DIR = Path(__file__).resolve().parents[1]

MiB = 1 << 20
GiB = 1 << 30

# Makes `import torch` fail in a subprocess, so torch-less behaviour is tested on every machine.
HIDE_TORCH = "import sys; sys.modules['torch'] = None\n"


def python_env(overrides: Optional[Dict[str, Optional[str]]] = None) -> Dict[str, str]:
    """This process's environment with python/ on PYTHONPATH (unless the installed package is
    under test, see conftest); an override of None deletes."""
    env = dict(os.environ)
    if env.get("STREAMPOOL_TEST_INSTALLED") != "1":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PYTHON_DIR), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    for name, value in (overrides or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def run_python(
    code: str = "",
    env: Optional[Dict[str, Optional[str]]] = None,
    args: Sequence[str] = (),
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """Run `python -c code` (or `python *args` when code is empty) in a fresh interpreter."""
    command = [sys.executable, "-c", code] if code else [sys.executable, *args]
    return subprocess.run(
        command, env=python_env(env), capture_output=True, text=True, timeout=timeout
    )


def describe(proc: subprocess.CompletedProcess) -> str:
    """The output of a finished subprocess, for assertion messages."""
    return f"exit status {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"


# A stand-in for PyTorch (stand_ins/torch): what install(), compare's bootstrap and PyTorch's memory
# functions touch, for CPU tests. Only subprocesses get it, never the test process.
STAND_INS = Path(__file__).resolve().parent / "stand_ins"


def stand_in_torch_env(**variables: Optional[str]) -> Dict[str, Optional[str]]:
    """Overrides for run_python: the stand-in torch first on PYTHONPATH, plus ``variables``."""
    path = python_env().get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(STAND_INS), path])), **variables}
