"""Made-up children's results for the CPU tests (never written outside a test's tmp_path)."""

from bench import report, targets


def record(
    host_s, gpu_s=None, device_bytes=1000, live_bytes=None, held_bytes=0, units=10, unit="step"
):
    """A child's record for one workload; live_bytes only in a native child's."""
    result = {
        "host_time_s": host_s,
        "gpu_time_s": host_s if gpu_s is None else gpu_s,
        "peak_device_bytes": device_bytes,
        "held_at_start_bytes": held_bytes,
        "timed_steps": 5,
        "units": units,
        "unit": unit,
    }
    if live_bytes is not None:
        result["peak_live_bytes"] = live_bytes
    return result


def child(records, status="ok", info=None):
    return {"status": status, "info": info or {}, "workloads": records, "wall_s": 9.0}


def failed_child(workloads, error, status="failed"):
    return child({w: {"error": error} for w in workloads}, status=status)


INFO = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "cuda": "13.0"}


def eight_repeats():
    """native, native-aa, expandable, streampool on gpt2 and empty_1KiB; streampool's gpt2 host
    time is 0.95-0.98x native's, its GPU time exactly native's; native-aa is 0.99-1.01x."""
    runs = []
    for repeat in range(8):
        native_gpt2 = 40.0 + repeat  # native drifts: the ratio must not
        wobble = (repeat % 3 - 1) * 0.01  # -0.01, 0, +0.01
        runs.append(
            {
                "native": child(
                    {
                        "gpt2": record(native_gpt2, 30.0, 1240, 1000),
                        "empty_1KiB": record(2.0, 2.0, 0, 0, unit="pair"),
                    },
                    info=INFO,
                ),
                "native-aa": child(
                    {
                        "gpt2": record(native_gpt2 * (1 + wobble), 30.0, 1250, 1001),
                        "empty_1KiB": record(2.0 * (1 - wobble), 2.0, 0, 0, unit="pair"),
                    },
                    info=INFO,
                ),
                "expandable": child(
                    {
                        "gpt2": record(native_gpt2 * 0.99, 30.0, 1070),
                        "empty_1KiB": record(2.1, 2.1, 0, unit="pair"),
                    },
                    info=INFO,
                ),
                "streampool": child(
                    {
                        "gpt2": record(
                            native_gpt2 * (0.95 + 0.01 * (repeat % 4)), 30.0, 1100 + repeat
                        ),
                        "empty_1KiB": record(1.8, 1.8, 0, unit="pair"),
                    },
                    info={**INFO, "streampool_version": "0.1.0"},
                ),
            }
        )
    return runs


CONFIGS = ["native", "native-aa", "expandable", "streampool"]


def build(runs=None, configs=CONFIGS, workloads=("empty_1KiB", "gpt2"), cotenant=None, **facts):
    runs = eight_repeats() if runs is None else runs
    return report.build_report(
        runs,
        configs=list(configs),
        workloads=list(workloads),
        repeats_requested=8,
        orders=[configs] * len(runs),
        stop_reason=facts.pop("stop_reason", None),
        cotenant=cotenant or {},
        facts={
            "command": "python3 -m bench --out-dir /tmp/x",
            "date": "2026-11-24 10:00 UTC",
            "driver": "580.65.06",
            "quick": False,
            "variants": {},
            "elapsed_s": 400.0,
            **facts,
        },
        target_document=targets.load(),
    )
