"""``python3 -m bench --out-dir DIR [--quick]``: the GPU benchmark (see cli.py and BENCHMARKS.md)."""

import sys

from .cli import main

sys.exit(main())
