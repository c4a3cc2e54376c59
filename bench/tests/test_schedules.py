"""The fixed schedules: the same on every call, warm-up meeting every shape, units per step."""

import pytest

from bench import schedules as s


def test_varying_schedule_meets_every_value_first_and_changes_every_step():
    schedule = s.varying_schedule((1, 2, 3), 20, seed=5)
    assert schedule == s.varying_schedule((1, 2, 3), 20, seed=5)
    assert len(schedule) == 20 and sorted(schedule[:3]) == [1, 2, 3]
    assert all(a != b for a, b in zip(schedule, schedule[1:]))
    assert s.varying_schedule((1, 2, 3), 2, seed=5) == schedule[:2]


def test_log_uniform_sizes_are_seeded_and_in_range():
    sizes = s.log_uniform_sizes_bytes(5000, 512, 64 * 2**20, seed=7)
    assert sizes == s.log_uniform_sizes_bytes(5000, 512, 64 * 2**20, seed=7)
    assert min(sizes) >= 512 and max(sizes) <= 64 * 2**20
    assert sum(x < 2**14 for x in sizes) > 1000 and sum(x > 2**21 for x in sizes) > 1000


@pytest.mark.parametrize("workload", s.TIMED_WORKLOADS)
def test_every_schedule_is_fixed_and_warms_every_shape_up(workload):
    schedule = s.build_schedule(workload)
    assert schedule == s.build_schedule(workload)  # seeded: every configuration runs the same
    warmup, timed = schedule.steps[: schedule.warmup], schedule.steps[schedule.warmup :]
    assert warmup and len(timed) >= 6
    assert set(timed) <= set(warmup) or workload == "churn"  # churn's sizes are all different
    assert len(schedule.units) == len(schedule.steps) and schedule.timed_units == sum(
        schedule.units[schedule.warmup :]
    )
    assert schedule.unit in s.UNIT_SCALE


def test_shapes_change_every_step_where_the_workload_is_about_changing_shapes():
    for workload in ("multistream", "llama_decode", "bert", "gpt2", "resnet50", "vision_sizes"):
        steps = s.build_schedule(workload).steps
        assert all(a != b for a, b in zip(steps, steps[1:])), workload


def test_units_are_pairs_tokens_samples_or_steps():
    empty = s.build_schedule("empty_1MiB")
    assert empty.unit == "pair" and empty.timed_units == 6 * s.EMPTY_PAIRS_PER_STEP
    llama = s.build_schedule("llama_decode")
    assert llama.unit == "token"
    assert llama.units == tuple(batch * s.LLAMA_NEW_TOKENS for batch, _ in llama.steps)
    bert = s.build_schedule("bert")
    assert bert.unit == "sample" and bert.units == tuple(batch for batch, _ in bert.steps)
    assert len(set(bert.steps[: bert.warmup])) == len(s.BERT_BATCHES) * len(s.BERT_LENGTHS)
    gpt2 = s.build_schedule("gpt2")
    assert gpt2.unit == "step" and gpt2.timed_units == s.GPT2_TIMED_STEPS
    assert sorted(gpt2.steps[: gpt2.warmup]) == list(s.GPT2_SEQ_LENGTHS)


def test_churn_steps_are_slices_of_one_seeded_size_list():
    churn = s.build_schedule("churn")
    assert all(len(step) == s.CHURN_OPS_PER_STEP for step in churn.steps)
    flat = [size for step in churn.steps for size in step]
    assert flat == s.log_uniform_sizes_bytes(
        len(flat), s.CHURN_MIN_BYTES, s.CHURN_MAX_BYTES, s.SEED
    )


def test_memory_ratio_is_for_all_but_the_empty_loops():
    assert not s.has_memory_ratio("empty_1KiB")
    assert all(s.has_memory_ratio(w) for w in ("churn", "gpt2", "llama_decode", "bert"))
    with pytest.raises(KeyError):
        s.build_schedule("cotenant")


def test_vision_shapes_vary_widely_within_the_pixel_budget():
    shapes = s.vision_shapes()
    assert len(set(shapes)) == s.VISION_SHAPES
    pixels = [b * h * w for b, h, w in shapes]
    assert max(pixels) <= s.VISION_MAX_PIXELS and max(pixels) >= 10 * min(pixels)
    assert len({h for _, h, _ in shapes}) >= 4 and len({w for _, _, w in shapes}) >= 4


def test_compiled_warm_up_records_every_shape_before_timing():
    schedule = s.build_schedule("compiled")
    warmup = schedule.steps[: schedule.warmup]
    assert all(warmup.count(shape) == s.COMPILED_WARMUP for shape in s.COMPILED_SHAPES)
    assert set(schedule.steps[schedule.warmup :]) == set(s.COMPILED_SHAPES)
