"""scripts/hot-path-gate's reading of a callgrind file: the simulated driver's cost is what the
calls from outside it into it include, counted once however deep it calls itself, and its calls
are counted; the rest is the allocator's (a made-up file in callgrind's compressed format)."""

import importlib.util
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest

_PATH = str(Path(__file__).resolve().parents[2] / "scripts" / "hot-path-gate")
_SPEC = importlib.util.spec_from_loader("hot_path_gate", SourceFileLoader("hot_path_gate", _PATH))
GATE = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(GATE)

CALLGRIND = """\
version: 1
positions: line
events: Ir
summary: 1000
fn=(1) pairs::measured
0 10
cfn=(2) streampool::device::DeviceAllocator::allocate
calls=4 0
0 700
fn=(2)
0 400
cfn=(3) streampool::driver::sim::streams::<impl X for streampool::driver::sim::SimDriver>::query
calls=6 0
0 300
fn=(3)
0 100
cfn=(4) streampool::driver::sim::SimDriver::count
calls=6 0
0 150
cfn=(5) hashbrown::map::HashMap<K,V,S,A>::insert
calls=2 0
+2 50
fn=(4)
0 150
fn=(5)
0 50
cfn=(6) __rust_alloc
calls=1 0
0 0
totals: 1000
"""


def test_the_driver_is_what_calls_into_it_include_and_the_rest_is_the_allocators():
    counts = GATE.parse(CALLGRIND)
    assert counts["total"] == 1000
    assert counts["driver"] == 300 and counts["driver_calls"] == 6  # not the sim's inner calls
    assert counts["total"] - counts["driver"] == 700
    assert counts["self"]["pairs::measured"] == 10
    assert counts["self"]["streampool::device::DeviceAllocator::allocate"] == 400
    assert counts["self"]["hashbrown::map::HashMap<K,V,S,A>::insert"] == 50


# Per instruction (--dump-instr=yes), with cache events: addresses absolute, then relative (+N,
# -N, *); a call's inclusive cost line (after calls=) is not the caller's own; the simulated
# driver's functions and other objects (libc) are left out of the places.
BY_INSTRUCTION = """\
version: 1
positions: instr line
events: Ir D1mr D1mw
summary: 53 14 3
ob=(1) /build/replay-abc
fn=(1) streampool::device::DeviceAllocator::allocate
0x1000 10 5 4 3
+4 * 3 1
cfn=(2) streampool::driver::sim::SimDriver::count
calls=1 0x2000 11
+2 * 40 7
-2 * 1 1
fn=(2)
0x2000 20 4 4
ob=(2) /lib/libc.so.6
fn=(3) malloc
0x50 5 2 2
totals: 53 14 3
"""


def test_by_site_counts_each_instructions_misses_under_its_frames(tmp_path, capsys, monkeypatch):
    out = tmp_path / "callgrind.out.1"
    out.write_text(BY_INSTRUCTION)
    asked = []

    def addr2line(command, input, **_):
        asked.append(input.split())
        frames = {"0x1000": ["src/device/mod.rs:10", "src/allocator.rs:5"],
                  "0x1004": ["src/device/ledger.rs:7"]}
        text = "".join(f"{a}\n" + "".join(f"{GATE.ROOT}/{f}\n" for f in frames.get(a, ["??:0"]))
                       for a in input.split())
        return GATE.subprocess.CompletedProcess(command, 0, text, "")

    monkeypatch.setattr(GATE.subprocess, "run", addr2line)
    assert GATE.cold_sites(str(out), 1, "/elsewhere/replay-abc") == 0
    text = capsys.readouterr().out
    # 0x1000: 4 + 3; 0x1004: 1 (its own line) + 1 (after the call, at 0x1004 again); the call's
    # inclusive 7 and the driver's 4 are not the allocator's; libc's 2 are counted apart.
    assert asked == [["0x1000", "0x1004"]]
    assert "7.00  src/device/mod.rs:10 < src/allocator.rs:5" in text
    assert "2.00  src/device/ledger.rs:7" in text
    assert "2.0 in other objects" in text


def test_by_site_refuses_a_file_without_instructions(tmp_path):
    out = tmp_path / "callgrind.out.2"
    out.write_text(CALLGRIND)
    try:
        GATE.cold_sites(str(out), 1, "replay")
    except SystemExit as e:
        assert "--dump-instr=yes" in str(e)
    else:
        raise AssertionError("a file without instruction positions was read")


# The replay's timed calls with data and code evicted: the simulated driver's inclusive cost (a
# call from the allocator into it) is left out of every event, code lines (I1mr) included.
COLD = """\
version: 1
positions: line
events: Ir I1mr D1mr D1mw ILmr DLmr DLmw
summary: 400 30 20 10 0 6 2
fn=(1) streampool::device::DeviceAllocator::allocate
0 300 20 16 8 0 5 2
cfn=(2) streampool::driver::sim::SimDriver::count
calls=1 0
0 100 10 4 2 0 1
fn=(2)
0 100 10 4 2 0 1
totals: 400 30 20 10 0 6 2
"""


def test_cold_lines_reports_code_lines_beside_data_lines(tmp_path, capsys):
    out = tmp_path / "callgrind.out.3"
    out.write_text(COLD)
    assert GATE.cold_lines(str(out), 2) == 0
    text = capsys.readouterr().out
    assert "150 instructions" in text
    assert "12.0 lines touched from cold" in text  # (20 - 4 + 10 - 2) / 2
    assert "10.0 lines of code fetched" in text  # (30 - 10) / 2


def test_a_path_or_a_trace_has_its_own_tolerance_and_a_name_of_neither_is_an_error():
    baseline = {"tolerance": 0.02, "paths": {"cached_small": {}}, "traces": {"churn pool": {}},
                "tolerances": {"churn pool": {"tolerance": 0.06, "why": "codegen"}}}
    assert GATE.own_tolerance(baseline, "churn pool") == 0.06
    assert GATE.own_tolerance(baseline, "cached_small") == 0.02
    baseline["tolerances"]["churn vmm"] = {"tolerance": 0.5, "why": "misspelt"}
    with pytest.raises(SystemExit, match="churn vmm"):
        GATE.own_tolerance(baseline, "cached_small")
