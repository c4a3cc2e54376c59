"""The worker: its memory pass, timed blocks and idle gaps (in this process, stand-in engine), its
command loop, and the protocol with real processes over pipes (WorkerGone, CommandFailed)."""

import json
import os
import sys
import threading

import pytest

from bench import affinity, protocol, worker
from bench.tests import standin
from bench.workers import CommandFailed, Worker, WorkerGone

ENGINE = "bench.tests.standin:StandinEngine"


class Clock:
    def __init__(self):
        self.now_s = 10.0

    def __call__(self):
        return self.now_s


def test_the_memory_pass_reads_memory_after_every_step_and_times_only_timed_steps(monkeypatch):
    monkeypatch.setenv("BENCH_CONFIG", "native")
    engine = standin.StandinEngine("native", "native")
    engine.set_up()
    record = worker.Worker(engine).prepare("gpt2")
    assert record["memory_source"] == "mem_get_info" and record["peak_process_bytes"] is None
    assert record["peak_device_bytes"] == standin.LIVE_BYTES + standin.STEP_BYTES
    assert record["peak_live_bytes"] == standin.LIVE_BYTES + standin.STEP_BYTES
    assert record["settled_bytes"] == standin.LIVE_BYTES  # cache returned, model kept
    assert record["timed_steps"] == len(standin.STEPS_MS) - 2
    assert record["step_s"] >= sum(standin.STEPS_MS[2:]) / 6 / 1000  # sleeps: at least


class GrowingEngine:
    """An engine whose every step takes 7 more bytes of device memory; ``memory`` as the test
    says (the bytes used so far in ``self.used``)."""

    def __init__(self, memory):
        self.used = 0
        self.memory = lambda: memory(self.used)

    def build(self, workload):
        def step(params):
            self.used += 7

        return step, worker_schedule()

    def track_live(self):
        return lambda: 5

    def synchronize(self):
        pass

    def settle(self):
        pass


def test_nvml_figures_win_over_free_memory_when_the_process_is_listed():
    engine = GrowingEngine(lambda used: {"free_bytes": 1000 - used * 2, "process_bytes": used})
    record = worker.Worker(engine).prepare("w")
    assert record["memory_source"] == "nvml"
    assert record["peak_device_bytes"] == record["peak_process_bytes"] == 7 * 4
    assert record["peak_free_drop_bytes"] == 7 * 4 * 2


def test_memory_held_idle_at_the_start_counts_in_the_peak():
    # Expandable segments hold 8 MiB of the workspace's granules free from before the start: the
    # growth alone would not show it.
    class Engine(GrowingEngine):
        def idle_reserved_bytes(self):
            return 8

    def memory(used):
        return {"free_bytes": 1000 - used, "process_bytes": None}

    record = worker.Worker(Engine(memory)).prepare("w")
    assert record["peak_grown_bytes"] == 7 * 4
    assert record["idle_reserved_at_start_bytes"] == 8
    assert record["peak_device_bytes"] == 7 * 4 + 8
    # an engine that cannot say: the growth alone
    record = worker.Worker(GrowingEngine(memory)).prepare("w")
    assert record["peak_device_bytes"] == 7 * 4 and record["idle_reserved_at_start_bytes"] is None


def worker_schedule():
    from bench import schedules

    return schedules.Schedule((1, 2, 3, 4), 1, (1, 1, 2, 3), "step")


def test_blocks_cycle_through_the_timed_steps_and_report_idle_gaps():
    clock = Clock()
    seen = []

    class Engine:
        def build(self, workload):
            def step(params):
                seen.append(params)
                clock.now_s += 0.5

            return step, worker_schedule()

        def memory(self):
            return {"free_bytes": None, "process_bytes": None}

        def track_live(self):
            return lambda: None

        def synchronize(self):
            pass

        def settle(self):
            pass

    running = worker.Worker(Engine(), clock=clock)
    running.prepare("w")
    seen.clear()
    warm = running.block(first=0, count=2, warm=True)
    assert warm["idle_before_s"] is None and seen == [2, 3]
    clock.now_s += 1.25  # the parent runs other workers' blocks
    timed = running.block(first=2, count=3)
    assert seen[2:] == [4, 2, 3]  # steps 2, 3, 4 of the three timed ones: cycling
    assert timed["elapsed_s"] == pytest.approx(1.5) and timed["units"] == 3 + 1 + 2
    assert timed["idle_before_s"] == pytest.approx(1.25)
    running.drop()
    with pytest.raises(RuntimeError, match="before prepare"):
        running.block(0, 1)


def test_a_block_records_gpu_time_cpu_time_switches_and_the_cpu_it_ended_on():
    # What the A/A diagnosis (noise.py) relates to the difference between two processes.
    clock, cpu_clock = Clock(), Clock()
    calls = []

    class Timer:
        def start(self, k):
            calls.append(("start", k))

        def stop(self, k):
            calls.append(("stop", k))

        def seconds(self):
            return 0.75

    class Engine:
        def build(self, workload):
            def step(params):
                calls.append(("step", params))
                clock.now_s += 0.5
                cpu_clock.now_s += 0.25  # half the block on the CPU

            return step, worker_schedule()

        def block_timer(self, count):
            calls.append(("timer", count))
            return Timer()

        def memory(self):
            return {"free_bytes": None, "process_bytes": None}

        def track_live(self):
            return lambda: None

        def synchronize(self):
            calls.append(("sync",))

        def settle(self):
            pass

    running = worker.Worker(Engine(), clock=clock, cpu_clock=cpu_clock)
    running.prepare("w")
    calls.clear()
    timed = running.block(first=0, count=2)
    # events around each step's launch, before its synchronisation
    assert calls == [("timer", 2), ("sync",), ("start", 0), ("step", 2), ("stop", 0), ("sync",),
                     ("start", 1), ("step", 3), ("stop", 1), ("sync",)]
    assert timed["gpu_s"] == 0.75 and timed["cpu_s"] == pytest.approx(0.5)
    assert timed["elapsed_s"] == pytest.approx(1.0)
    assert isinstance(timed["cpu"], int) and timed["cpu"] in os.sched_getaffinity(0)
    assert timed["nvcsw"] >= 0 and timed["nivcsw"] >= 0
    calls.clear()  # a warm-up block records no events (a step there may still compile)
    assert running.block(first=0, count=1, warm=True)["gpu_s"] is None
    assert not [c for c in calls if c[0] in ("timer", "start", "stop")]
    Timer.seconds = lambda self: 1 / 0  # events the driver cannot time: no GPU time, no failure
    assert running.block(first=0, count=1)["gpu_s"] is None
    # an engine without a timer (the stand-in, an old engine): no GPU time, the rest as before
    engine = standin.StandinEngine("native", "native")
    plain = worker.Worker(engine)
    plain.prepare("gpt2")
    block = plain.block(first=0, count=1)
    assert block["gpu_s"] is None and block["cpu_s"] >= 0 and set(worker.DIAGNOSTICS) <= set(block)


def test_the_cpu_a_thread_ran_on_is_field_39_of_its_stat_line(tmp_path):
    # the command name (field 2) may hold spaces and parentheses
    fields = ["S"] + [str(n) for n in range(4, 39)] + ["7", "0", "0"]
    stat = tmp_path / "stat"
    stat.write_text("1234 (a (b) c) " + " ".join(fields) + "\n")
    assert worker.current_cpu([str(tmp_path / "absent"), str(stat)]) == 7
    stat.write_text("1234 (short) S 1 2\n")
    assert worker.current_cpu([str(stat)]) is None


def test_serve_answers_every_command_and_survives_a_failing_one(monkeypatch):
    monkeypatch.setenv("BENCH_CONFIG", "expandable")
    monkeypatch.setenv("BENCH_STANDIN", "expandable:fail=bert")
    sent = []
    lines = [
        json.dumps({"command": "prepare", "workload": "bert"}),
        json.dumps({"command": "prepare", "workload": "gpt2"}),
        json.dumps({"command": "block", "first": 0, "count": 2}),
        json.dumps({"command": "jump"}),
    ]
    engine = standin.StandinEngine("native", "native")
    assert worker.serve(engine, lines, emit=lambda kind, **f: sent.append((kind, f))) == 0
    kinds = [(kind, fields.get("ok")) for kind, fields in sent]
    assert kinds == [("ready", None), ("reply", False), ("reply", True), ("reply", True),
                     ("reply", False)]
    assert "cannot build bert" in sent[1][1]["error"]
    assert "OutOfMemoryError" in sent[1][1]["error"].splitlines()[-1]  # the end of the error
    assert "unknown command 'jump'" in sent[4][1]["error"]


def test_a_failed_set_up_is_reported_not_raised(monkeypatch):
    monkeypatch.setenv("BENCH_CONFIG", "torch-async")
    monkeypatch.setenv("BENCH_STANDIN", "torch-async:fail=setup")
    sent = []
    engine = standin.StandinEngine("native", "cudaMallocAsync")
    worker.serve(engine, [], emit=lambda kind, **f: sent.append((kind, f)))
    assert sent[0][0] == "setup_error" and "set-up failed on purpose" in sent[0][1]["reason"]


def start(config, environ=None, engine=ENGINE):
    env = {"PYTHONPATH": str(standin.__file__).rsplit("/bench/", 1)[0], "BENCH_CONFIG": config}
    env.update(environ or {})
    return Worker(config, worker.command("native", "native", engine), env, echo=False)


def test_a_real_worker_process_over_pipes():
    process = start("native")
    try:
        assert process.wait_ready(60)["config"] == "native"
        record = process.request("prepare", 60, workload="churn")
        assert record["peak_device_bytes"] == standin.LIVE_BYTES + standin.STEP_BYTES
        block = process.request("block", 60, first=0, count=3, warm=False)
        assert block["elapsed_s"] > 0 and block["units"] == 3
        with pytest.raises(CommandFailed, match="unknown command"):
            process.request("jump", 60)
        assert process.request("drop", 60)["free_bytes"] == standin.TOTAL_BYTES
    finally:
        process.close(10)
    assert process.popen.returncode == 0


def test_a_worker_that_exits_is_gone_with_the_end_of_its_stderr():
    process = start("streampool", {"BENCH_STANDIN": "streampool:exit=gpt2"})
    try:
        process.wait_ready(60)
        process.request("prepare", 60, workload="gpt2")
        with pytest.raises(WorkerGone, match="exited with status 3"):
            process.request("block", 60, first=0, count=1)
        with pytest.raises(WorkerGone):  # and stays gone
            process.request("block", 60, first=0, count=1)
    finally:
        process.close(10)


def test_a_worker_that_cannot_start_says_why():
    process = start("native", engine="bench.tests.standin:NoSuchEngine")
    try:
        with pytest.raises(WorkerGone, match="AttributeError.*NoSuchEngine"):
            process.wait_ready(60)
    finally:
        process.close(10)


def test_a_silent_worker_times_out():
    code = "import time; time.sleep(30)"
    process = Worker("sleeper", [sys.executable, "-c", code], {}, echo=False)
    try:
        with pytest.raises(WorkerGone, match="no answer in 0.2 s"):
            process.receive(0.2)
    finally:
        process.close(0.5)
    assert process.popen.returncode is not None


def test_protocol_lines_round_trip_and_errors_keep_their_end():
    line = protocol.encode("reply", ok=True, result={"x": 1})
    assert protocol.decode(line) == {"kind": "reply", "ok": True, "result": {"x": 1}}
    assert protocol.decode("some library's print") is None
    with pytest.raises(ValueError):
        protocol.encode("nonsense")
    text = "\n".join(f"line {i}" for i in range(30))
    assert protocol.tail(text).splitlines() == [f"line {i}" for i in range(22, 30)]


def test_workers_import_what_their_workloads_need_while_they_start():
    from bench import schedules

    assert schedules.preload_modules(["churn", "gpt2", "bert", "vision_sizes"]) == [
        "transformers", "torchvision"]
    argv = worker.command("streampool", "pluggable", preload=["transformers"])
    assert argv[-2:] == ["--preload", "transformers"]
    sent = []
    worker.serve(standin.StandinEngine("native", "native"), [], preload=["no_such_module_x"],
                 emit=lambda kind, **f: sent.append((kind, f)))
    assert sent[0][0] == "setup_error" and "no_such_module_x" in sent[0][1]["reason"]


class StepEngine:
    """An engine whose workload is ``step``, with no memory to speak of."""

    def __init__(self, step):
        self.step = step

    def build(self, workload):
        return self.step, worker_schedule()

    def memory(self):
        return {"free_bytes": 0, "process_bytes": None}

    def track_live(self):
        return lambda: 0

    def synchronize(self):
        pass

    def settle(self):
        pass


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell apart")
def test_a_block_runs_on_the_launch_cpu_and_the_thread_goes_back_to_its_own_after_it():
    # isolation.py's ``launch``: both blocks of a pair on one CPU; the thread's own CPUs for
    # everything else (a failing step included).
    allowed = sorted(os.sched_getaffinity(0))
    own, launch = allowed[:1], allowed[-1:]
    seen = []

    def step(params):
        seen.append(os.sched_getaffinity(0))
        if params == "fail":
            raise RuntimeError("step failed")

    os.sched_setaffinity(0, own)
    try:
        running = worker.Worker(StepEngine(step), launch_cpus=launch)
        running.prepare("w")
        assert seen and all(s == set(own) for s in seen)  # the memory pass on its own CPUs
        seen.clear()
        block = running.block(first=0, count=3)
        assert seen == [set(launch)] * 3 and block["cpu"] == launch[0]
        assert os.sched_getaffinity(0) == set(own)
        assert block["system_s"] is None or block["system_s"] >= 0
        assert block["steal_s"] is None or block["steal_s"] >= 0
        running.timed = ("fail",)
        with pytest.raises(RuntimeError):
            running.block(first=0, count=1)
        assert os.sched_getaffinity(0) == set(own)
        unpinned = worker.Worker(StepEngine(step))  # no launch CPU: its own
        unpinned.prepare("w")
        seen.clear()
        unpinned.block(first=0, count=1)
        assert seen == [set(own)]
    finally:
        os.sched_setaffinity(0, allowed)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell apart")
def test_autograd_threads_go_to_the_launch_cpu_with_the_block_and_back_after_it():
    # GPT-2's backward pass launches its kernels from autograd's thread: left on the worker's
    # own cores, a slow CPU there slows one side of a pair. Other threads stay where they are.
    allowed = sorted(os.sched_getaffinity(0))
    own, launch = allowed[:1], allowed[-1:]
    started, done = threading.Barrier(3, timeout=30), threading.Event()
    tids = {}

    def named(name):
        with open("/proc/thread-self/comm", "w") as comm:
            comm.write(name)
        tids[name] = threading.get_native_id()
        started.wait()
        done.wait(30)

    seen = []

    def step(params):
        seen.append({n: os.sched_getaffinity(t) for n, t in tids.items()})
        if params == "fail":
            raise RuntimeError("step failed")

    os.sched_setaffinity(0, own)
    threads = [threading.Thread(target=named, args=(n,)) for n in ("pt_autograd_0", "other")]
    try:
        for t in threads:
            t.start()
        started.wait()
        for moves in (True, False):
            running = worker.Worker(StepEngine(step), launch_cpus=launch, move_autograd=moves)
            running.prepare("w")
            seen.clear()
            block = running.block(first=0, count=1)
            wanted = set(launch) if moves else set(own)
            assert seen == [{"pt_autograd_0": wanted, "other": set(own)}]
            # (any autograd thread of this process counts; ours is one of them)
            assert block["threads_moved"] == (len(affinity.autograd_threads()) if moves else 0)
            assert os.sched_getaffinity(tids["pt_autograd_0"]) == set(own)
        # A step that fails: autograd's thread goes back too.
        running = worker.Worker(StepEngine(step), launch_cpus=launch, move_autograd=True)
        running.prepare("w")
        running.timed = ("fail",)
        with pytest.raises(RuntimeError):
            running.block(first=0, count=1)
        assert seen[-1]["pt_autograd_0"] == set(launch)
        assert os.sched_getaffinity(tids["pt_autograd_0"]) == set(own)
        assert os.sched_getaffinity(0) == set(own)
    finally:
        done.set()
        for t in threads:
            t.join()
        os.sched_setaffinity(0, allowed)


def test_steal_is_read_from_the_cpu_lines_of_proc_stat(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  9 9 9 9 9 9 9 900 0 0\ncpu0 1 2 3 4 5 6 7 100 0 0\n"
                    "cpu1 1 2 3 4 5 6 7 300 0 0\nintr 5 0\n")
    tick = os.sysconf("SC_CLK_TCK")
    assert worker.steal_seconds([1], str(stat)) == pytest.approx(300 / tick)
    assert worker.steal_seconds([0, 1], str(stat)) == pytest.approx(400 / tick)
    assert worker.steal_seconds([0], str(tmp_path / "absent")) is None
