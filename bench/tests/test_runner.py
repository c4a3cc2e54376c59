"""The parent's run over real worker processes with stand-in steps: pairing and ABBA order in
time, a slower configuration found, failures of every kind kept with the end of their error,
stages by memory and by idle gap, and the report built from it."""

from pathlib import Path

import pytest

from bench import report, runner, targets
from bench.configs import pairs_of

ENGINE = "bench.tests.standin:StandinEngine"
CONFIGS = ["native", "native-aa", "expandable", "torch-async", "streampool", "streampool-vmm"]
# Steps 4 times the stand-in's (blocks of 16 ms), so that a busy 2-core machine's late
# wake-ups stay small beside streampool's 2x.
BEHAVIOUR = ";".join([
    "*:slow=4",
    "streampool:slow=8",
    "expandable:fail=bert",
    "expandable:memory=0.5",
    "torch-async:fail=setup",
    "streampool-vmm:raise=churn",
])


def run(configs, workloads, behaviour, pairs=12, block_s=0.004, idle_release_s=None):
    environ = {"BENCH_STANDIN": behaviour, "PYTHONPATH": ""}
    options = runner.Options(pairs, block_s, idle_release_s)
    live = runner.Runner(configs, {}, environ, options, engine=ENGINE, log=lambda _: None)
    try:
        records = runner.run_group(live, workloads, pairs_of(configs, {}))
    finally:
        live.close()
    return live, records


@pytest.fixture(scope="module")
def mixed():
    return run(CONFIGS, ["bert", "gpt2", "churn"], BEHAVIOUR, block_s=0.016)


def test_pairs_are_abba_in_time_on_the_same_steps(mixed):
    _, records = mixed
    gpt2 = records[1]
    by_config = {}
    for pair in gpt2["pairs"]:
        by_config.setdefault(pair["config"], []).append(pair)
    assert set(by_config) == {"native-aa", "expandable", "streampool", "streampool-vmm"}
    for config, pairs in by_config.items():
        assert len(pairs) == 12, config
        assert [p["ref_first"] for p in pairs] == [r % 2 == 0 for r in range(12)]
        assert all(p["ref"] == "native" and p["units"] == gpt2["steps_per_block"] for p in pairs)
        assert all(p["steps"] == p["ref_steps"] for p in pairs)  # both blocks: the same steps
    starts = [p["steps"][0] for p in gpt2["pairs"]]
    assert len(set(starts)) > 1  # pairs move on through the schedule


def test_a_slower_configuration_is_found_and_the_aa_is_not(mixed):
    _, records = mixed
    cells = report.workload_cells([{"workloads": records}])["gpt2"]
    low, high = cells["streampool"]["time"]["ci95"]  # sleeps on a shared machine: loose
    assert 1.3 < low and 1.5 < cells["streampool"]["time"]["ratio"] < 3
    aa = cells["native-aa"]["time"]
    assert 0.8 < aa["ratio"] < 1.25 and aa["n"] == 12


def test_failures_are_kept_with_their_error_never_dropped(mixed):
    live, records = mixed
    bert, gpt2, churn = records
    assert "cannot build bert" in bert["failed"]["expandable"]
    assert "expandable" not in gpt2["failed"]  # a failed workload loses no other
    for record in records:
        assert "set-up failed on purpose" in record["failed"]["torch-async"]
    assert "step failed in churn" in churn["failed"]["streampool-vmm"]
    assert not [p for p in churn["pairs"] if p["config"] == "streampool-vmm"]
    cells = report.workload_cells([{"workloads": records}])
    assert cells["bert"]["expandable"]["failed"]
    assert "OutOfMemoryError" in cells["bert"]["expandable"]["errors"][0]
    assert cells["churn"]["torch-async"]["failed"] and cells["gpt2"]["torch-async"]["failed"]
    assert "torch-async" in live.dead


def test_memory_is_the_memory_pass_against_native_peak_live(mixed):
    _, records = mixed
    cells = report.workload_cells([{"workloads": records}])["gpt2"]
    assert cells["native"]["memory"]["ratio"] == 1.0
    assert cells["expandable"]["memory"]["ratio"] == pytest.approx((100 + 10) / 120)
    rows = [r for r in targets.judge(report.build([{"workloads": records}]))
            if r["metric"] == "memory" and r["workload"] == "gpt2"]
    assert {r["config"]: r["status"] for r in rows}["streampool"] == "not met"  # 1.0 > 0.917


def test_a_worker_that_exits_fails_this_workload_and_every_later_one():
    live, records = run(["native", "streampool"], ["gpt2", "churn"], "streampool:exit=gpt2",
                        pairs=2)
    assert "exited with status 3" in records[0]["failed"]["streampool"]
    assert "worker could not run" in records[1]["failed"]["streampool"]
    assert records[1]["prepare"].keys() == {"native"}


def test_a_configuration_that_never_fits_is_reported_not_skipped():
    _, records = run(["native", "native-aa", "streampool"], ["gpt2"], "streampool:memory=5000",
                     pairs=2)
    assert "does not fit on the card" in records[0]["failed"]["streampool"]
    assert {p["config"] for p in records[0]["pairs"]} == {"native-aa"}


def test_a_short_idle_release_splits_the_pairs_into_stages_and_gaps_are_recorded():
    _, records = run(["native", "native-aa", "streampool"], ["gpt2"], "", pairs=10,
                     idle_release_s=0.001)
    record = records[0]
    stages = [[list(pair) for pair in stage] for stage in record["stages"]]
    assert stages == [[["native", "native-aa"]], [["native", "streampool"]]]
    cells = report.workload_cells([{"workloads": records,
                                    "facts": {"idle_release_s": 0.001}}])["gpt2"]
    assert cells["streampool"]["max_idle_s"] > 0.001
    assert cells["streampool"]["gap_over_idle_release"] is True


def test_a_worker_that_dies_in_its_memory_pass_fails_there_and_later():
    live, records = run(["native", "native-aa", "streampool"], ["gpt2", "churn"],
                        "streampool:crash=gpt2", pairs=2)
    assert "exited with status 4" in records[0]["failed"]["streampool"]
    assert "worker could not run" in records[1]["failed"]["streampool"]
    assert {p["config"] for r in records for p in r["pairs"]} == {"native-aa"}


def test_the_warm_up_rule():
    assert not runner.settled([0.30, 0.30])
    assert not runner.settled([0.30, 0.30, 0.20])  # a plateau, then it fell
    assert not runner.settled([0.30, 0.20, 0.199])  # fell in the last two
    assert runner.settled([0.30, 0.20, 0.199, 0.198])  # within 2% twice
    assert runner.settled([0.20, 0.25, 0.25])  # slower: not falling any more


def run_cold(settle, idle_release_s=None):
    # Steps 10 times the stand-in's (a 2-step block: 30 ms warm, 90 ms cold), so that a busy
    # 2-core machine's late wake-ups (several ms) cannot make a warm block look cold: the CI
    # once saw native-aa settle after 3 blocks at the stand-in's 3 ms.
    environ = {"BENCH_STANDIN": "*:slow=10;native-aa:cold=10",
               "PYTHONPATH": ""}
    options = runner.Options(6, 0.03, idle_release_s, settle)
    live = runner.Runner(["native", "native-aa", "streampool"], {}, environ, options,
                         engine=ENGINE, log=lambda _: None)
    try:
        (record,) = runner.run_group(live, ["gpt2"], pairs_of(["native", "native-aa"], {}))
    finally:
        live.close()
    return record


def test_a_cold_worker_warms_up_until_its_blocks_stop_getting_faster():
    # native-aa's first 10 steps after a settle take 3x: the timed steps once (3 blocks of 2
    # steps) leave 2 slow blocks; the rule runs them untimed, then fast ones until settled.
    record = run_cold(settle=True)
    (blocks,) = record["warm_up_blocks"]
    assert blocks["native-aa"] >= 4 and blocks["native"] >= 3
    first = [p for p in record["pairs"] if p["config"] == "native-aa"][0]
    assert first["config_s"] / first["ref_s"] < 2
    cold = run_cold(settle=False)  # the timed steps once: the first pairs are still cold
    (none,) = cold["warm_up_blocks"]
    assert none == {"native": 0, "native-aa": 0}
    first = [p for p in cold["pairs"] if p["config"] == "native-aa"][0]
    assert first["config_s"] / first["ref_s"] > 2


def test_a_worker_carried_into_the_next_stage_warms_up_again_with_the_new_ones():
    # One pair a stage (a short idle release): native goes on from the first stage into the
    # second and idles while streampool (3 times as slow) warms up, longer than native's
    # idle_cold: like a reference whose idle release gave its memory back, its next 10 steps
    # take 3x. Warmed up again, its timed blocks are warm: streampool's pairs read about 3,
    # not about 1 (both sides cold), as they did when a carried-over worker went on without.
    environ = {"BENCH_STANDIN": "*:slow=10;streampool:slow=30;native:cold=10;native:idle_cold=250",
               "PYTHONPATH": ""}
    live = runner.Runner(["native", "native-aa", "streampool"], {}, environ,
                         runner.Options(4, 0.03, 0.001), engine=ENGINE, log=lambda _: None)
    try:
        (record,) = runner.run_group(live, ["gpt2"], pairs_of(["native", "native-aa",
                                                                "streampool"], {}))
    finally:
        live.close()
    assert [list(map(list, stage)) for stage in record["stages"]] == [
        [["native", "native-aa"]], [["native", "streampool"]]]
    first, second = record["warm_up_blocks"]
    assert set(first) == {"native", "native-aa"} and set(second) == {"native", "streampool"}
    ratios = [p["config_s"] / p["ref_s"] for p in record["pairs"] if p["config"] == "streampool"]
    assert len(ratios) == 4 and min(ratios[:2]) > 2, ratios


class ScriptedWorker:
    """A worker whose blocks take the given times, in order; every request is logged."""

    def __init__(self, name, times_s, log):
        self.name, self.times_s, self.log = name, iter(times_s), log

    def request(self, command, timeout_s, **kw):
        self.log.append(self.name)
        return {"elapsed_s": next(self.times_s)}


def test_a_worker_that_settles_first_runs_on_until_every_worker_has():
    # "fast" settles after 3 blocks, "slow" after 7 (its blocks fall until then): in turn,
    # "fast" runs a block for each of "slow"'s, never idling while "slow" settles.
    log = []
    live = object.__new__(runner.Runner)
    live.options = runner.Options(1, 0.01, 2.0)
    live.dead = {}
    live.workers = {"fast": ScriptedWorker("fast", [1.0] * 20, log),
                    "slow": ScriptedWorker("slow", [9.0, 8, 7, 6, 5, 4, 4, 4] + [4] * 12, log)}
    counts = live._warm_up(["fast", "slow"], cycle=2, per_block=2, failed={})
    assert counts == {"fast": 3, "slow": 7}
    assert log == ["fast", "slow"] * 8  # one cycle block each, then 7 rounds of settling


def test_each_block_of_a_pair_keeps_its_own_diagnostics_and_clock():
    # The NVML sample after a block belongs to that block's configuration, whichever ran first
    # (``gpu`` lists the samples in the order the blocks ran).
    class Sampler(runner.Sampler):
        def __init__(self):
            super().__init__()
            self.pids = {}

        def after_block(self, pid):
            return {"sm_mhz": self.pids[pid], "throttled": False}, None

    sampler = Sampler()
    live = runner.Runner(["native", "native-aa"], {}, {"PYTHONPATH": ""},
                         runner.Options(4, 0.003, None), sampler, engine=ENGINE,
                         log=lambda _: None)
    try:
        sampler.pids = {live.workers["native"].pid: 1980, live.workers["native-aa"].pid: 1755}
        (record,) = runner.run_group(live, ["gpt2"], pairs_of(["native", "native-aa"], {}))
    finally:
        live.close()
    assert [p["ref_first"] for p in record["pairs"]] == [True, False, True, False]
    for pair in record["pairs"]:
        assert pair["config_block"]["sm_mhz"] == 1755 and pair["ref_block"]["sm_mhz"] == 1980
        for side in ("config_block", "ref_block"):
            assert pair[side]["gpu_s"] is None  # the stand-in has no CUDA events
            assert pair[side]["cpu_s"] >= 0 and isinstance(pair[side]["cpu"], int)


def test_every_worker_starts_with_arguments_and_environment_of_the_same_size():
    # isolation.even_environments: what the kernel puts at the top of each worker's stack
    # (/proc/PID/cmdline and environ) is as many strings of as many bytes in every worker.
    names = ["native", "native-aa", "expandable", "streampool-vmm"]
    live = runner.Runner(names, {}, {"PYTHONPATH": ""}, runner.Options(2, 0.003, None),
                         engine=ENGINE, log=lambda _: None,
                         worker_env={"native": {"BENCH_PROCESS": "0"},
                                     "native-aa": {"BENCH_PROCESS": "12345"}})
    try:
        sizes = {}
        for name, started in live.workers.items():
            argv = Path(f"/proc/{started.pid}/cmdline").read_bytes()
            env = Path(f"/proc/{started.pid}/environ").read_bytes()
            sizes[name] = (argv.count(b"\0") + env.count(b"\0"), len(argv) + len(env))
        assert not live.setup_differs  # the padding is left out of the fingerprint
    finally:
        live.close()
    assert len(set(sizes.values())) == 1, sizes
