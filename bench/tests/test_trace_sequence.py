"""The benchmark-sequence trace: the input unchanged, then empty_cache() between two
synchronisations, then blocks of timed steps (new IDs, no synchronisation between a block's
steps, one at its end), cycling through the timed steps; what a block leaves allocated is freed
at its end; the result is a valid trace."""

from bench import trace_sequence as ts

HEADERS = ["workload demo", "schedule_steps 3 (warm-up 1)", "events 12", "peak_live_bytes 4"]
# Warm-up step: 1 and 2; timed step A: 3 (kept until step B frees it), 4; timed step B frees 3.
EVENTS = [
    ("a", ["1", "512", "0"], 0), ("f", ["1"], 5), ("s", [], 6), ("x", [], 7),
    ("a", ["3", "1024", "0"], 10), ("a", ["4", "2048", "1"], 11), ("r", ["4", "0"], 12),
    ("f", ["4"], 13), ("s", [], 20), ("x", [], 21),
    ("f", ["3"], 30), ("s", [], 31), ("x", [], 32),
]


def check_valid(events):
    live, last = set(), 0
    for kind, fields, t in events:
        assert t >= last, "timestamps never decrease"
        last = t
        if kind == "a":
            assert fields[0] not in live
            live.add(fields[0])
        elif kind in ("f", "r"):
            assert fields[0] in live
            if kind == "f":
                live.remove(fields[0])


def test_the_pass_then_empty_cache_then_blocks_of_timed_steps():
    headers, events = ts.build(HEADERS, EVENTS, blocks=3, per_block=1, gap_us=100)
    assert events[: len(EVENTS)] == EVENTS
    rest = events[len(EVENTS):]
    assert [k for k, _, _ in rest[:3]] == ["s", "e", "s"]
    check_valid(events)
    blocks = rest[3:]
    # Block 0 is step A (its 3 kept: freed at the block's end), block 1 step B (nothing of its
    # own to free), block 2 step A again.
    kinds = [k for k, _, _ in blocks]
    assert kinds == ["a", "a", "r", "f", "x", "f", "s", "x", "s", "a", "a", "r", "f", "x", "f", "s"]
    ids = [f[0] for k, f, _ in blocks if k == "a"]
    assert len(set(ids)) == 4 and not set(ids) & {"1", "3", "4"}, "new IDs for every copy"
    assert blocks[0][2] == EVENTS[-1][2] + 100, "the gap before a block"
    assert "schedule_steps 6 (warm-up 3)" in headers, "every step of the pass counts as warm-up"
    assert "sequence_block_end_frees 2" in headers
    assert not any(h.startswith(("events ", "peak_live_bytes ")) for h in headers)


def test_a_trace_without_timed_steps_is_refused():
    import pytest

    with pytest.raises(ValueError, match="no timed steps"):
        ts.build(["schedule_steps 1 (warm-up 1)"], EVENTS[:4], blocks=1, per_block=1, gap_us=0)


def test_write_then_read_round_trips(tmp_path):
    path = tmp_path / "t.trace.gz"
    ts.write(path, HEADERS, EVENTS)
    assert ts.read(path) == (HEADERS, EVENTS)
