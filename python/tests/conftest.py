"""Test setup: which streampool is tested, and, in this process, the simulated driver.

By default the tests import streampool from python/ in this checkout, with the library that
``STREAMPOOL_LIBRARY`` names (scripts/test builds it). With ``STREAMPOOL_TEST_INSTALLED=1`` they
test the streampool installed in the running interpreter (a wheel, ``pip install .``) with the
library inside that package: python/ is not put on any path.

The library reads STREAMPOOL_* once per process, so the environment is fixed here, before any test
loads it; cases that need other values run in subprocesses (see helpers.run_python). GPU cases
(test_gpu.py) also run in subprocesses, with the simulated-driver settings removed.
"""

import os

import pytest
import sys
from pathlib import Path

PYTHON_DIR = Path(__file__).resolve().parents[1]
INSTALLED = os.environ.get("STREAMPOOL_TEST_INSTALLED") == "1"

if INSTALLED:
    os.environ.pop("STREAMPOOL_LIBRARY", None)  # the package's own library is what is tested
else:
    sys.path.insert(0, str(PYTHON_DIR))

# The backend under test: STREAMPOOL_TEST_BACKEND if it names one, else the package's default
# (BACKEND, below; scripts/test runs the suite under both).
_NAMED = os.environ.get("STREAMPOOL_TEST_BACKEND")
if _NAMED not in (None, "pool", "vmm"):
    raise RuntimeError(f"STREAMPOOL_TEST_BACKEND={_NAMED!r}: expected pool or vmm")
_KEPT = (
    "STREAMPOOL_LIBRARY",
    "STREAMPOOL_TEST_INSTALLED",
    "STREAMPOOL_TEST_BACKEND",
    "STREAMPOOL_TEST_SETTINGS",
    "STREAMPOOL_TEST_PARITY_RESULTS",
)
for _name in [n for n in os.environ if n.startswith("STREAMPOOL_") and n not in _KEPT]:
    del os.environ[_name]
os.environ.update(
    {"STREAMPOOL_DRIVER": "sim", "STREAMPOOL_SIM_DEVICES": "2", "STREAMPOOL_SIM_MEMORY": "16GiB"}
)
if _NAMED is not None:
    os.environ["STREAMPOOL_BACKEND"] = _NAMED

import streampool  # noqa: E402  (after the path and the environment are set)
from streampool._config import VARIABLE_DEFAULTS  # noqa: E402

BACKEND = _NAMED or VARIABLE_DEFAULTS["STREAMPOOL_BACKEND"]

if INSTALLED and Path(streampool.__file__).resolve().parent.parent == PYTHON_DIR:
    raise RuntimeError(
        f"STREAMPOOL_TEST_INSTALLED=1 but streampool comes from the checkout ({streampool.__file__}): "
        "run pytest with the interpreter the package is installed in, outside python/"
    )


def pytest_report_header(config):
    from streampool import _lib

    return f"streampool: {Path(streampool.__file__).parent} (library: {_lib.find_library()})"


def pool_backend_only(test):
    """For a test of the CUDA pool backend's own behaviour (its cache of large blocks, its event
    sequence); the vmm backend's counterpart is in test_vmm.py. Runs when the suite runs on the
    pool backend (scripts/test runs it under STREAMPOOL_TEST_BACKEND=pool; the default is vmm)."""
    return pytest.mark.skipif(
        BACKEND != "pool", reason="pool backend behaviour (scripts/test runs it under pool)"
    )(test)
