"""Test setup: streampool is imported from python/ and, in this process, runs on the simulated driver.

The library reads STREAMPOOL_* once per process, so the environment is fixed here, before any test
loads it; cases that need other values run in subprocesses (see helpers.run_python). GPU cases
(test_gpu.py) also run in subprocesses, with the simulated-driver settings removed.
"""

import os
import sys
from pathlib import Path

PYTHON_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PYTHON_DIR))

for _name in [n for n in os.environ if n.startswith("STREAMPOOL_") and n != "STREAMPOOL_LIBRARY"]:
    del os.environ[_name]
os.environ.update(
    {"STREAMPOOL_DRIVER": "sim", "STREAMPOOL_SIM_DEVICES": "2", "STREAMPOOL_SIM_MEMORY": "16GiB"}
)
