"""The co-tenant's trial with stand-in processes: B probes at 0.5, 3 and 10 s after A idles,
held beyond live = A's free memory at its start - B's free memory - A's live bytes, the next
holder loads while this one idles, and every failure becomes the trial's error."""

import pytest

from bench import cotenant
from bench.workers import CommandFailed, WorkerGone

GIB = 2**30
EVENTS = []  # what the holder was told and the prober asked, in order


class Clock:
    def __init__(self):
        self.now_s = 100.0

    def __call__(self):
        return self.now_s

    def sleep(self, seconds):
        self.now_s += seconds


class Holder:
    """A releases what it caches 2 s after going idle (an idle release)."""

    def __init__(self, messages):
        self.messages, self.sent, self.closed = list(messages), [], False

    def receive(self, timeout_s):
        message = self.messages.pop(0)
        if isinstance(message, Exception):
            raise message
        return message

    def send(self, payload):
        self.sent.append(payload)
        EVENTS.append(payload["command"])

    def close(self, timeout_s):
        self.closed = True


class Prober:
    def __init__(self, clock, idle_at, start_free=70 * GIB, live=1.5 * GIB, cached=12 * GIB):
        self.clock, self.idle_at, self.asked = clock, idle_at, []
        self.start_free, self.live, self.cached = start_free, live, cached

    def request(self, command, timeout_s):
        self.asked.append((command, self.clock()))
        EVENTS.append(command)
        if command == "free":
            return {"free_bytes": 75 * GIB}
        released = self.idle_at[0] is not None and self.clock() - self.idle_at[0] >= 2.0
        free = self.start_free - self.live - (0.25 * GIB if released else self.cached)
        return {"free_bytes": int(free), "tried_bytes": int(free - GIB // 4), "confirmed": True,
                "error": None}


IDLE = {"kind": "idle", "free_bytes_at_start": 70 * GIB, "live_bytes": int(1.5 * GIB),
        "empty_cache_called": False, "device": "stand-in"}


def test_probes_at_the_idle_times_and_held_beyond_live():
    clock, idle_at, started = Clock(), [None], []
    EVENTS.clear()
    holder = Holder([{"kind": "loaded"}, IDLE])
    prober = Prober(clock, idle_at)

    def start_next():
        idle_at[0] = clock()  # the holder said idle just before
        started.append(clock())

    result = cotenant.trial("streampool", holder, prober, start_next, clock=clock,
                            sleep=clock.sleep)
    assert holder.sent == [{"command": "go"}] and holder.closed and len(started) == 1
    assert [p["idle_s"] for p in result["probes"]] == [0.5, 3.0, 10.0]
    held = [p["held_beyond_live_bytes"] / GIB for p in result["probes"]]
    assert held == pytest.approx([12.0, 0.25, 0.25])
    assert EVENTS == ["free", "go", "probe", "probe", "probe"]  # B's baseline before A's CUDA
    assert result["live_bytes"] == int(1.5 * GIB) and result["free_before_bytes"] == 75 * GIB


@pytest.mark.parametrize(
    "messages, text",
    [
        ([{"kind": "skipped", "reason": "rmm is not importable"}], "skipped: rmm"),
        ([{"kind": "loaded"}, {"kind": "setup_error", "reason": "CUDA error: out of memory"}],
         "out of memory"),
        ([{"kind": "loaded"}, WorkerGone("cotenant A exited with status 1:\nboom")], "boom"),
    ],
)
def test_a_failed_trial_is_an_error_and_the_next_holder_still_loads(messages, text):
    clock, started = Clock(), []
    holder = Holder(messages)
    result = cotenant.trial("torch-async", holder, Prober(clock, [None]),
                            lambda: started.append(1), clock=clock, sleep=clock.sleep)
    assert text in result["error"] and "probes" not in result
    assert holder.closed and started == [1]


def test_a_prober_that_fails_fails_the_trial():
    clock = Clock()

    class Broken(Prober):
        def request(self, command, timeout_s):
            raise CommandFailed("RuntimeError: CUDA error: an illegal memory access")

    result = cotenant.trial("native", Holder([{"kind": "loaded"}, IDLE]), Broken(clock, [None]),
                            lambda: None, clock=clock, sleep=clock.sleep)
    assert "illegal memory access" in result["error"]


def test_holder_commands_follow_the_configurations():
    command = cotenant.holder_command("native+empty_cache")
    assert command[-1] == "--empty-cache" and "native" in command
    command = cotenant.holder_command("streampool-threshold-1GiB")
    assert command[command.index("--base") + 1] == "streampool"
    assert "--empty-cache" not in command
