"""The benchmark's CPU tests: no torch, no GPU. The repository root (for ``bench``) and python/
(for ``streampool._config``) are put on sys.path so that ``pytest bench/tests`` works alone; the
calibration file the run reads and the calibration writes is the test's own, never the
repository's."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "python"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def own_calibration_file(tmp_path, monkeypatch):
    from bench import plan

    monkeypatch.setattr(plan, "CALIBRATION_PATH", tmp_path / "calibration.json")
