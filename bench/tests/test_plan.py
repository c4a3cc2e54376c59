"""The plan: ABBA order and rotation, idle gaps it promises, block sizes, stages that fit the
card, the idle-release setting."""

import pytest

from bench import plan

PAIRS = [("native", "native-aa"), ("native", "expandable"), ("native", "streampool")]


def test_each_pair_alternates_which_side_goes_first():
    for ref, config in PAIRS:
        firsts = [
            ref_first
            for r in range(6)
            for a, b, ref_first in plan.round_order(PAIRS, r)
            if (a, b) == (ref, config)
        ]
        assert firsts == [True, False] * 3  # ABBA over consecutive rounds


def test_rounds_rotate_the_pairs():
    orders = [[c for _, c, _ in plan.round_order(PAIRS, r)] for r in range(3)]
    assert orders[0] == ["native-aa", "expandable", "streampool"]
    assert orders[1] == ["streampool", "native-aa", "expandable"]
    assert {o[0] for o in orders} == {"native-aa", "expandable", "streampool"}


def test_blocks_of_a_pair_are_adjacent_and_gaps_stay_within_the_promise():
    rounds = 8
    sequence = plan.block_sequence(PAIRS, rounds)
    assert len(sequence) == 2 * len(PAIRS) * rounds
    for index in range(0, len(sequence), 2):  # a pair's two blocks run back to back
        assert set(sequence[index : index + 2]) <= {"native", *[c for _, c in PAIRS]}
        assert "native" in sequence[index : index + 2]
    for name in {"native", *[c for _, c in PAIRS]}:
        positions = [i for i, n in enumerate(sequence) if n == name]
        gaps = [b - a - 1 for a, b in zip(positions, positions[1:])]
        assert max(gaps) <= plan.gap_blocks(len(PAIRS)), name


def test_steps_per_block():
    assert plan.steps_per_block(0.2, 0.045) == 4
    assert plan.steps_per_block(0.2, 0.5) == 1  # a step longer than a block: one step
    assert plan.steps_per_block(0.2, 0.0) == 1
    with pytest.raises(ValueError):
        plan.steps_per_block(0.0, 0.01)


def test_stage_size_keeps_gaps_under_the_idle_release_delay():
    assert plan.max_pairs_for_gap(None, 0.2) is None
    pairs = plan.max_pairs_for_gap(2.0, 0.1)
    assert (2 * pairs + 2) * 0.1 <= plan.GAP_MARGIN * 2.0 < (2 * (pairs + 1) + 2) * 0.1
    assert plan.max_pairs_for_gap(2.0, 5.0) == 1


GIB = 2**30


def test_stages_pack_pairs_that_fit_together():
    active = {"native": 14 * GIB, "native-aa": 14 * GIB, "expandable": 13 * GIB,
              "streampool": 13 * GIB}
    idle = {name: 3 * GIB for name in active}
    staged, left_out = plan.stages(PAIRS, active, idle, 80 * GIB)
    assert staged == [PAIRS] and left_out == {}
    staged, left_out = plan.stages(PAIRS, active, idle, 40 * GIB)  # 36 GiB usable
    assert staged == [[PAIRS[0]], [PAIRS[1]], [PAIRS[2]]] and left_out == {}
    for stage in staged:  # each stage fits with every other worker idle
        members = {n for pair in stage for n in pair}
        need = sum(active[n] for n in members) + sum(idle[n] for n in set(active) - members)
        assert need <= plan.CARD_FRACTION * 40 * GIB


def test_stages_respect_the_gap_limit_and_name_what_never_fits():
    active = {"native": GIB, "native-aa": GIB, "expandable": GIB, "streampool": 90 * GIB}
    idle = {name: GIB for name in active}
    staged, left_out = plan.stages(PAIRS, active, idle, 80 * GIB, max_pairs=1)
    assert staged == [[PAIRS[0]], [PAIRS[1]]]
    assert "does not fit" in left_out["streampool"] and "native" in left_out["streampool"]


def test_idle_release_setting():
    assert plan.idle_release_s({}) == plan.IDLE_RELEASE_DEFAULT_S == 2.0
    assert plan.idle_release_s({"STREAMPOOL_IDLE_RELEASE": "500ms"}) == 0.5
    assert plan.idle_release_s({"STREAMPOOL_IDLE_RELEASE": " 1.5S "}) == 1.5
    for off in ("off", "never", "0"):  # as the library reads it
        assert plan.idle_release_s({"STREAMPOOL_IDLE_RELEASE": off}) is None
    for bad in ("soon", "2", "-1s", "0s"):  # the library refuses these too
        with pytest.raises(ValueError, match=f"STREAMPOOL_IDLE_RELEASE='{bad}'.*off"):
            plan.idle_release_s({"STREAMPOOL_IDLE_RELEASE": bad})


def test_every_timed_workload_is_in_one_group_and_has_an_estimate():
    from bench.schedules import TIMED_WORKLOADS

    grouped = [w for workloads in plan.GROUPS.values() for w in workloads]
    assert sorted(grouped) == sorted(TIMED_WORKLOADS)
    assert set(plan.PREPARE_S) == set(TIMED_WORKLOADS)
    assert set(plan.START_S) == set(plan.GROUPS)


def test_the_default_groups_fit_a_nine_minute_call_with_margin():
    # The run's whole point of process sets is lost if a group cannot run in one call.
    from bench.configs import DEFAULT_CONFIGS

    for group, workloads in plan.GROUPS.items():
        settings = plan.settings_for(workloads)
        seconds = plan.estimate_s(workloads, len(DEFAULT_CONFIGS), settings, plan.start_s(group))
        assert seconds < 8 * 60, (group, seconds)


def test_settings_come_from_the_calibration_then_the_command_line():
    calibration = {"facts": {"date": "2026-12-01"},
                   "workloads": {"gpt2": {"block_s": 0.4, "pairs": 5, "processes": 4}}}
    settings = plan.settings_for(["gpt2", "bert"], calibration)
    assert settings["gpt2"] == plan.Setting(0.4, 5, 4, "calibration 2026-12-01")
    assert settings["bert"] == plan.Setting(plan.DEFAULT_BLOCK_S, plan.DEFAULT_PAIRS,
                                            plan.DEFAULT_PROCESSES, "defaults")
    given = plan.settings_for(["gpt2"], calibration, pairs=9)["gpt2"]
    assert given == plan.Setting(0.4, 9, 4, "command line")


def test_estimates_count_every_process_set_and_use_measured_costs():
    one = plan.Setting(0.2, 8, 1)
    three = one._replace(processes=3)
    assert plan.workload_s("gpt2", 6, three) == pytest.approx(3 * plan.workload_s("gpt2", 6, one))
    assert plan.estimate_s(["bert"], 6, {"bert": three}, 10.0) == pytest.approx(
        30.0 + plan.workload_s("bert", 6, three))
    measured = {"workloads": {"gpt2": {"measured": {"prepare_s": 1.0, "pair_s": {"0.2": 0.5},
                                                    "warm_up_s": {"0.2": 0.25}}}}}
    assert plan.workload_s("gpt2", 6, one, measured) == 6 * (1.0 + 0.25) + 5 * 8 * 0.5


def test_a_model_built_first_in_a_worker_costs_its_first_build_wherever_it_runs():
    surcharge = plan.FIRST_BUILD_S["transformers"]
    # The calibration's figures are for each workload's place in its group (bert before gpt2).
    assert plan.first_build_s("gpt2", ["multistream", "gpt2"]) == surcharge
    assert plan.first_build_s("gpt2", ["bert", "gpt2"]) == 0.0
    assert plan.first_build_s("bert", ["bert"]) == 0.0
    assert plan.first_build_s("bert", ["gpt2", "bert"]) == -surcharge
    assert plan.first_build_s("churn", ["churn"]) == 0.0

    setting = plan.Setting(0.1, 4, 5)
    settings = {"multistream": setting, "gpt2": setting}
    alone = plan.estimate_s(["gpt2"], 5, settings, 0.0)
    assert alone == pytest.approx(plan.workload_s("gpt2", 5, setting) + 5 * 5 * surcharge)
    after_bert = plan.estimate_s(["bert", "gpt2"], 5, {**settings, "bert": setting}, 0.0)
    assert after_bert == pytest.approx(plan.workload_s("bert", 5, setting)
                                       + plan.workload_s("gpt2", 5, setting))
    # Built after gpt2, bert's memory pass is shorter than its figure, but never below nothing.
    gpt2_first = plan.estimate_s(["gpt2", "bert"], 5, {**settings, "bert": setting}, 0.0)
    assert gpt2_first == pytest.approx(
        plan.workload_s("gpt2", 5, setting, prepare_shift_s=surcharge)
        + plan.workload_s("bert", 5, setting, prepare_shift_s=-surcharge))
    assert plan.workload_s("churn", 5, setting, prepare_shift_s=-1e6) == pytest.approx(
        plan.workload_s("churn", 5, setting)
        - 5 * 5 * plan.costs("churn", setting.block_s)["prepare_s"])
