"""The sequence diagnostic runs the memory pass, then each block after its gap, and reports what
streampool's counters moved in each block alone."""

import sys
import types

from bench import diag_sequence


def test_each_block_reports_its_own_counter_deltas(monkeypatch):
    counts = {k: 0 for k in diag_sequence.COUNTERS}
    calls = []

    class Engine:
        def __init__(self, base, backend):
            assert (base, backend) == ("streampool", "pluggable")

        def set_up(self):
            calls.append("set_up")

    class Worker:
        def __init__(self, engine):
            pass

        def prepare(self, workload):
            calls.append(("prepare", workload))
            counts["num_maps"] += 100
            return {"peak_device_bytes": 64 << 20}

        def block(self, first, count):
            calls.append(("block", first, count))
            counts["num_maps"] += first  # block b maps b * count pages
            return {"elapsed_s": 0.01}

    monkeypatch.setitem(sys.modules, "bench.engine", types.SimpleNamespace(CudaEngine=Engine))
    monkeypatch.setitem(sys.modules, "bench.worker", types.SimpleNamespace(Worker=Worker))
    fake = types.SimpleNamespace(memory_stats=lambda: dict(counts))
    monkeypatch.setitem(sys.modules, "streampool", fake)
    monkeypatch.setattr(diag_sequence.time, "sleep", lambda s: calls.append(("sleep", s)))
    lines = diag_sequence.run("bert", blocks=3, per_block=7, gap_s=0.15)
    assert calls[:2] == ["set_up", ("prepare", "bert")]
    assert calls[2:] == [("sleep", 0.15), ("block", 0, 7), ("sleep", 0.15), ("block", 7, 7),
                         ("sleep", 0.15), ("block", 14, 7)]
    assert "memory pass: num_maps=100" in lines[0] and "peak_device_mib=64" in lines[0]
    assert [line.split("num_maps=")[1].split()[0] for line in lines[1:]] == ["0", "7", "14"]
