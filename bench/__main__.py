"""``python3 -m bench --out-dir DIR [--quick]``: the GPU benchmark (cli.py, BENCHMARKS.md)."""

import sys

from .cli import main

sys.exit(main())
