"""The co-tenant workload without a GPU: B's binary search, the two-process protocol with fake
processes (B searches only after A is idle; A exits only after B answered), and the summary."""

import sys
import textwrap

import pytest

from bench import cotenant, cotenant_child, protocol

GIB = 2**30


@pytest.mark.parametrize("limit_bytes", [0, 1, 3 * GIB + 12345, 61 * GIB, 80 * GIB - 1])
def test_the_search_finds_the_largest_fit_within_its_resolution(limit_bytes):
    tried = []

    def fits(size_bytes):
        tried.append(size_bytes)
        return size_bytes <= limit_bytes

    found = cotenant_child.largest_fit_bytes(fits, 80 * GIB)
    assert found <= limit_bytes  # never claims what did not fit
    assert (
        limit_bytes - found
        <= cotenant_child.PROBE_RESOLUTION_BYTES + cotenant_child.PROBE_ALIGN_BYTES
    )
    assert found % cotenant_child.PROBE_ALIGN_BYTES == 0
    assert len(tried) <= 12  # a binary search, not a scan


def test_the_search_takes_everything_when_everything_fits():
    assert cotenant_child.largest_fit_bytes(lambda size: True, 80 * GIB) == 80 * GIB


def write(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body).replace("MARKER", repr(protocol.RESULT_MARKER)))
    return [sys.executable, str(path)]


HOLDER = """
    import json, sys, time
    def emit(kind, **fields):
        print(MARKER + json.dumps(dict(kind=kind, **fields)), flush=True)
    time.sleep(0.3)  # trains
    open(sys.argv[1], "a").write("A idle\\n")
    emit("ready", info={"device": "Fake"}, trained_steps=8, empty_cache_called=False,
         free_bytes_when_idle=50, device_total_bytes=100)
    sys.stdin.read()
    open(sys.argv[1], "a").write("A exits\\n")
"""

PROBER = """
    import json, sys
    def emit(kind, **fields):
        print(MARKER + json.dumps(dict(kind=kind, **fields)), flush=True)
    emit("ready", device_total_bytes=100)
    if not sys.stdin.readline():
        sys.exit(1)  # as the real prober: stdin closed without a "go"
    open(sys.argv[1], "a").write("B searches\\n")
    emit("fit", fit_bytes=60, device_total_bytes=100, free_bytes_before=62)
"""


def test_a_trial_runs_b_only_while_a_idles(tmp_path, monkeypatch):
    log = tmp_path / "log.txt"
    holder, prober = write(tmp_path, "a.py", HOLDER), write(tmp_path, "b.py", PROBER)
    monkeypatch.setattr(cotenant, "holder_command", lambda name: holder + [str(log)])
    monkeypatch.setattr(cotenant, "prober_command", lambda: prober + [str(log)])
    result = cotenant.run_trial("streampool", {}, 30, "test")
    assert result["fit_bytes"] == 60 and result["device_total_bytes"] == 100
    assert result["empty_cache_called"] is False and result["a_free_bytes_when_idle"] == 50
    assert log.read_text().splitlines() == ["A idle", "B searches", "A exits"]


def test_a_holder_that_fails_is_an_error_and_both_processes_end(tmp_path, monkeypatch):
    failing = write(
        tmp_path,
        "a.py",
        """
        import json
        print(MARKER + json.dumps({"kind": "setup_error", "reason": "StreampoolError: bad value"}), flush=True)
    """,
    )
    prober = write(tmp_path, "b.py", PROBER)
    log = tmp_path / "log.txt"
    monkeypatch.setattr(cotenant, "holder_command", lambda name: failing)
    monkeypatch.setattr(cotenant, "prober_command", lambda: prober + [str(log)])
    result = cotenant.run_trial("streampool-vmm", {}, 30, "test")
    assert result["error"] == "StreampoolError: bad value"
    assert not log.exists()  # B was never told to search


def test_a_holder_that_hangs_times_out(tmp_path, monkeypatch):
    hanging = write(tmp_path, "a.py", "import time\ntime.sleep(60)\n")
    prober = write(tmp_path, "b.py", PROBER)
    monkeypatch.setattr(cotenant, "holder_command", lambda name: hanging)
    monkeypatch.setattr(cotenant, "prober_command", lambda: prober + [str(tmp_path / "log")])
    result = cotenant.run_trial("native", {}, 1.0, "test")
    assert "no 'ready' before the trial's time-out" in result["error"] and result["wall_s"] < 40


def test_rounds_and_summary():
    fits = {"native": [0.60, 0.62], "streampool-threshold-1GiB": [0.95, 0.94]}
    calls = []

    def trial(name, environ, timeout_s, label):
        calls.append(name)
        if name == "rmm-async":
            return {"error": "skipped: no rmm", "wall_s": 0.1}
        fraction = fits[name][sum(1 for c in calls if c == name) - 1]
        return {
            "fit_bytes": int(fraction * 1000),
            "device_total_bytes": 1000,
            "empty_cache_called": False,
            "wall_s": 1.0,
        }

    rounds = cotenant.run_cotenant(
        ["native", "streampool-threshold-1GiB", "rmm-async"], 2, {}, 10, trial
    )
    assert calls == [
        "native",
        "streampool-threshold-1GiB",
        "rmm-async",
        "native",
        "streampool-threshold-1GiB",
    ]
    cells = cotenant.summarise(rounds)
    assert cells["native"]["cotenant_fit_fraction"] == pytest.approx(0.61)
    assert (
        cells["native"]["cotenant_fit_fraction_min"],
        cells["native"]["cotenant_fit_fraction_max"],
    ) == (0.6, 0.62)
    assert cells["streampool-threshold-1GiB"]["fit_bytes"] == 945
    assert cells["rmm-async"] == {"error": "skipped: no rmm"}
