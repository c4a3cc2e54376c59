"""The benchmark's CPU tests: no torch, no GPU. The repository root (for ``bench``) and python/
(for ``streampool._config``) are put on sys.path so that ``pytest bench/tests`` works alone."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "python"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
