"""The demo's idle release reported once it has run its course: a release that comes in two
steps (blocks that waited for another stream come back a tick later) is shown whole."""

import streampool
from streampool import _demo

MiB = 1 << 20


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_a_release_in_two_steps_is_reported_once_both_are_done(monkeypatch):
    clock = FakeClock()
    # 32 MiB are still reserved for the first 0.3 s (a block that waited), then none.
    monkeypatch.setattr(streampool, "memory_reserved",
                        lambda: 32 * MiB if clock.now < 0.3 else 0)
    assert _demo._settled(32 * MiB, clock, clock.sleep, deadline=10.0) == 0
    assert clock.now < 0.5, "no longer than it took"


def test_a_release_that_stops_short_is_reported_once_steady_or_at_the_deadline(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(streampool, "memory_reserved", lambda: 8 * MiB)
    assert _demo._settled(8 * MiB, clock, clock.sleep, deadline=10.0) == 8 * MiB
    assert _demo.IDLE_SETTLE_S <= clock.now < _demo.IDLE_SETTLE_S + 0.1
    clock.now = 0.0
    assert _demo._settled(8 * MiB, clock, clock.sleep, deadline=0.2) == 8 * MiB
    assert clock.now < 0.3, "the deadline bounds the wait"
