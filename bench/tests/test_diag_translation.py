"""The translation diagnostic runs every chosen configuration twice, in ABBA order, each in a
child of its own; and the step diagnostics make the libraries' handles first only when asked."""

import sys

from bench.tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import diag_configs  # noqa: E402
import diag_steps  # noqa: E402
import diag_translation  # noqa: E402


def test_each_configuration_runs_twice_in_abba_order(monkeypatch):
    ran = []
    monkeypatch.setenv("DIAG_CONFIGS", "native,vmm,span")
    span = "span:STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_SPAN_SIZE=256MiB"
    monkeypatch.setenv("DIAG_VARIANTS", span)
    monkeypatch.setattr(diag_configs, "run_child", lambda script, config, args: ran.append(config))
    monkeypatch.setattr(sys, "argv", ["diag_translation.py"])
    assert diag_translation.main() == 0
    assert ran == ["native", "vmm", "span", "span", "vmm", "native"]


def test_libraries_are_warmed_first_only_when_asked(monkeypatch):
    warmed = []
    import bench.engine

    monkeypatch.setattr(bench.engine, "warm_up_libraries", lambda torch: warmed.append(torch))
    monkeypatch.setattr(diag_steps, "WARM_LIBRARIES", False)
    diag_steps.prepare("torch")
    assert warmed == []
    monkeypatch.setattr(diag_steps, "WARM_LIBRARIES", True)
    diag_steps.prepare("torch")
    assert warmed == ["torch"]
