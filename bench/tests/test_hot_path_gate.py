"""scripts/hot-path-gate's reading of a callgrind file: the simulated driver's cost is what the
calls from outside it into it include, counted once however deep it calls itself, and its calls
are counted; the rest is the allocator's (a made-up file in callgrind's compressed format)."""

import importlib.util
from importlib.machinery import SourceFileLoader
from pathlib import Path

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
