"""The fixed schedule of every timed workload: which shapes each step uses, in which order.

Invariant: a schedule depends only on the workload's name (seeded ``random.Random``, no clock, no
device), so every configuration and machine runs the same steps in the same order; its warm-up
steps meet every distinct shape at least once before the first timed step, so per-shape set-up
(cuBLAS/cuDNN heuristics, the allocator's first growth to that shape) is not timed. Pure Python:
the parent and the CPU tests import it without torch.
"""

import math
import random
from typing import Any, Dict, List, NamedTuple, Sequence, Tuple

SEED = 1234

EMPTY_SIZES_BYTES = {"empty_1KiB": 1024, "empty_1MiB": 1024**2, "empty_64MiB": 64 * 1024**2}
# Every timed workload ("cotenant" is not one: it is two processes, see cotenant.py).
TIMED_WORKLOADS = tuple(EMPTY_SIZES_BYTES) + (
    "churn",
    "multistream",
    "llama_decode",
    "bert",
    "gpt2",
    "resnet50",
    "vision_sizes",
    "compiled",
)
COTENANT = "cotenant"
# What a worker imports while it starts when it will run these workloads.
PRELOAD_MODULES = {
    "llama_decode": ("transformers",),
    "bert": ("transformers",),
    "gpt2": ("transformers",),
    "resnet50": ("torchvision",),
    "vision_sizes": ("torchvision",),
    "compiled": ("torch._inductor",),
}


def preload_modules(workloads: Sequence[str]) -> List[str]:
    """The modules ``workloads`` need, each once."""
    return list(dict.fromkeys(m for w in workloads for m in PRELOAD_MODULES.get(w, ())))

# empty_*: a step is a round of this many torch.empty + del pairs.
EMPTY_PAIRS_PER_STEP = 10_000
EMPTY_STEPS = (1, 6)  # (warm-up, timed)
# churn: allocations of log-uniform sizes, each kept until CHURN_WINDOW newer ones exist.
CHURN_OPS_PER_STEP = 200
CHURN_WINDOW = 64
CHURN_MIN_BYTES = 512
CHURN_MAX_BYTES = 64 * 1024**2
CHURN_STEPS = (10, 50)
# multistream: square bf16 matrices of these sides, products made on a side stream.
MULTISTREAM_SIDES = (512, 1024, 1536, 2048, 3072)
MULTISTREAM_PRODUCTS = 4
MULTISTREAM_TIMED_STEPS = 200
# llama_decode: a request is (batch, prompt length); it generates LLAMA_NEW_TOKENS tokens per
# sequence, one forward per token, the KV cache growing by one position every token.
LLAMA_REQUESTS = ((1, 32), (1, 256), (2, 128), (4, 64), (8, 32), (8, 192))
LLAMA_NEW_TOKENS = 16
LLAMA_TIMED_REQUESTS = 12
# bert: every call a new (batch, sequence length).
BERT_BATCHES = (1, 2, 4, 8, 16, 32)
BERT_LENGTHS = (32, 64, 128, 256, 384)
BERT_TIMED_CALLS = 40
# Training: GPT-2 124M at batch 8 and ResNet-50 at 224x224, one shape per step.
GPT2_BATCH = 8
GPT2_SEQ_LENGTHS = tuple(range(128, 1025, 128))
GPT2_TIMED_STEPS = 10
RESNET_BATCHES = tuple(range(32, 129, 16))
RESNET_IMAGE_SIDE = 224
RESNET_TIMED_STEPS = 10
# vision_sizes: ResNet-50 training on images whose batch, height and width change every step
# (multi-scale training): VISION_SHAPES seeded picks of (batch, height, width), at most
# VISION_MAX_PIXELS pixels a batch so that several workers fit on one card.
VISION_BATCHES = (4, 8, 16, 24, 32)
VISION_SIDES = (128, 192, 256, 320, 384, 448, 512)
VISION_MAX_PIXELS = 16 * 448 * 448
VISION_SHAPES = 16
VISION_TIMED_STEPS = 24
# compiled: torch.compile(mode="reduce-overhead") (CUDA graphs) inference of a small transformer;
# each (batch, length) is compiled and recorded once, so the warm-up meets each COMPILED_WARMUP
# times (a graph is recorded on a shape's second call and replayed from its third).
COMPILED_SHAPES = ((4, 256), (8, 256), (8, 512))
COMPILED_WARMUP = 3
COMPILED_TIMED_STEPS = 30


class Schedule(NamedTuple):
    """``steps[:warmup]`` are run untimed, ``steps[warmup:]`` timed; ``units[i]`` is how many of
    ``unit`` step ``i`` does (a time per unit is the timed steps' time over their units)."""

    steps: Tuple[Any, ...]
    warmup: int
    units: Tuple[int, ...]
    unit: str

    @property
    def timed_units(self) -> int:
        return sum(self.units[self.warmup :])


def varying_schedule(values: Sequence[Any], count: int, seed: int) -> List[Any]:
    """``count`` picks from ``values``, the same on every run: first each value once (shuffled),
    then random picks, never the same value twice in a row."""
    rng = random.Random(seed)
    schedule = list(values)
    rng.shuffle(schedule)
    while len(schedule) < count:
        schedule.append(rng.choice([v for v in values if v != schedule[-1]]))
    return schedule[:count]


def log_uniform_sizes_bytes(count: int, low_bytes: int, high_bytes: int, seed: int) -> List[int]:
    """``count`` sizes log-uniformly spread over [low_bytes, high_bytes], the same on every run."""
    rng = random.Random(seed)
    low, high = math.log(low_bytes), math.log(high_bytes)
    return [
        min(high_bytes, max(low_bytes, int(math.exp(rng.uniform(low, high))))) for _ in range(count)
    ]


def _varying(values: Sequence[Any], timed: int, unit_of, unit: str) -> Schedule:
    """Each value once (warm-up), then ``timed`` seeded picks."""
    steps = tuple(varying_schedule(values, len(values) + timed, SEED))
    return Schedule(steps, len(values), tuple(unit_of(s) for s in steps), unit)


def _empty() -> Schedule:
    warmup, timed = EMPTY_STEPS
    steps = (EMPTY_PAIRS_PER_STEP,) * (warmup + timed)
    return Schedule(steps, warmup, steps, "pair")


def _churn() -> Schedule:
    """A step is a tuple of CHURN_OPS_PER_STEP sizes (bytes)."""
    warmup, timed = CHURN_STEPS
    sizes = log_uniform_sizes_bytes(
        (warmup + timed) * CHURN_OPS_PER_STEP, CHURN_MIN_BYTES, CHURN_MAX_BYTES, SEED
    )
    steps = tuple(
        tuple(sizes[i : i + CHURN_OPS_PER_STEP]) for i in range(0, len(sizes), CHURN_OPS_PER_STEP)
    )
    return Schedule(steps, warmup, (1,) * len(steps), "step")


def vision_shapes() -> List[Tuple[int, int, int]]:
    """VISION_SHAPES distinct (batch, height, width), seeded, within VISION_MAX_PIXELS."""
    rng = random.Random(SEED)
    fitting = [
        (b, h, w)
        for b in VISION_BATCHES
        for h in VISION_SIDES
        for w in VISION_SIDES
        if b * h * w <= VISION_MAX_PIXELS
    ]
    return sorted(rng.sample(fitting, VISION_SHAPES))


def _compiled() -> Schedule:
    """Each shape COMPILED_WARMUP times in a row (compile, record, replay), then seeded picks."""
    warmup = [shape for shape in COMPILED_SHAPES for _ in range(COMPILED_WARMUP)]
    timed = varying_schedule(COMPILED_SHAPES, COMPILED_TIMED_STEPS, SEED)
    steps = tuple(warmup + timed)
    return Schedule(steps, len(warmup), tuple(b for b, _ in steps), "sample")


def build_schedule(workload: str) -> Schedule:
    """The schedule of ``workload`` (one of TIMED_WORKLOADS)."""
    if workload in EMPTY_SIZES_BYTES:
        return _empty()
    if workload == "churn":
        return _churn()
    if workload == "multistream":
        return _varying(MULTISTREAM_SIDES, MULTISTREAM_TIMED_STEPS, lambda _: 1, "step")
    if workload == "llama_decode":
        return _varying(
            LLAMA_REQUESTS, LLAMA_TIMED_REQUESTS, lambda s: s[0] * LLAMA_NEW_TOKENS, "token"
        )
    if workload == "bert":
        shapes = [(b, n) for b in BERT_BATCHES for n in BERT_LENGTHS]
        return _varying(shapes, BERT_TIMED_CALLS, lambda s: s[0], "sample")
    if workload == "gpt2":
        return _varying(GPT2_SEQ_LENGTHS, GPT2_TIMED_STEPS, lambda _: 1, "step")
    if workload == "resnet50":
        return _varying(RESNET_BATCHES, RESNET_TIMED_STEPS, lambda _: 1, "step")
    if workload == "vision_sizes":
        return _varying(vision_shapes(), VISION_TIMED_STEPS, lambda _: 1, "step")
    if workload == "compiled":
        return _compiled()
    raise KeyError(f"no schedule for workload {workload!r}")


def has_memory_ratio(workload: str) -> bool:
    """Whether a memory ratio is reported for ``workload`` (not for the empty_* loops)."""
    return workload not in EMPTY_SIZES_BYTES


UNIT_SCALE: Dict[str, Tuple[float, str]] = {
    # unit -> (factor from seconds, text) for times per unit in reports
    "pair": (1e6, "µs/pair"),
    "step": (1e3, "ms/step"),
    "token": (1e3, "ms/token"),
    "sample": (1e3, "ms/sample"),
}
