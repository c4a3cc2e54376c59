"""``python3 -m bench``: the GPU benchmark (cli.py, BENCHMARKS.md)."""

import sys

from .cli import main

sys.exit(main())
