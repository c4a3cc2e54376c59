"""The sleep-and-wake benchmark's figures and report (bench/sleep.py has the method): a child's
record -> the report's figures (``row``) -> Markdown and the summary lines, and the constants both
sides share.

Invariant: pure functions (no torch, no GPU, no I/O): the CPU tests
(bench/tests/test_sleep_report.py) render fabricated records through them.
"""

from typing import Any, Dict, List, Optional

from . import protocol

GIB = 2**30
GB = 1e9

NATIVE = "native"
STREAMPOOL = "streampool-vmm"
STREAMPOOL_RESERVED = "streampool-vmm-reserved"
STREAMPOOLS = (STREAMPOOL, STREAMPOOL_RESERVED)
TMS = "tms"
TMS_TORCH = "tms-torch"
CONFIGS = (NATIVE, STREAMPOOL, STREAMPOOL_RESERVED, TMS, TMS_TORCH)
DESCRIPTIONS = {
    NATIVE: "PyTorch's caching allocator, no sleep (the footprint)",
    STREAMPOOL: 'streampool.install(backend="vmm", idle_release="off") (the sleep gives back '
    'everything itself); streampool.sleep(level=1) / wake()',
    STREAMPOOL_RESERVED: "as streampool-vmm, with streampool.reserve_sleep_buffer() before the "
    "first sleep (timed apart, reserve_s in sleep.json): the host buffer pinned ahead",
    TMS: "torch_memory_saver, hook mode preload (LD_PRELOAD), region(enable_cpu_backup=True); "
    "empty_cache() + pause() / resume()",
    TMS_TORCH: 'torch_memory_saver, hook_mode = "torch" (pluggable allocator), otherwise as tms',
}

TARGET_GIVEN_BACK_PCT = 99.0
TARGET_LINK_PCT = 80.0
TMS_REPORTED_GIVEN_BACK_PCT = 97.7

# ---------------------------------------------------------------------------------------------
# Pure functions: a child's record -> the report's figures -> Markdown and summary lines.


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (JSON without NaN)."""
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def memory_source(record: Dict[str, Any]) -> str:
    """"nvml-process" when every reading of ``record`` has this process's NVML figure, else
    "device-used" (total - free of the whole device)."""
    readings = [record.get(k) for k in ("context", "before", "asleep", "woken") if record.get(k)]
    if readings and all(r.get("process_bytes") is not None for r in readings):
        return "nvml-process"
    return "device-used"


def held(reading: Optional[Dict[str, Any]], source: str) -> Optional[int]:
    """The bytes a reading says are held, by ``source``."""
    if not reading:
        return None
    if source == "nvml-process":
        return reading.get("process_bytes")
    return reading.get("device_used_bytes")


def given_back_pct(before: Optional[int], asleep: Optional[int],
                   context: Optional[int]) -> Optional[float]:
    """Of the process: (before - asleep) / (before - context) in percent; None without the three
    or when the workload held nothing beyond the context."""
    if before is None or asleep is None or context is None or before - context <= 0:
        return None
    return 100.0 * (before - asleep) / (before - context)


def allocator_given_back_pct(before: Optional[int], asleep: Optional[int],
                             reserved_before: Optional[int]) -> Optional[float]:
    """Of what the allocator held: the drop of the process's device memory over the sleep,
    (before - asleep), over the allocator's reserved bytes before it (PyTorch's
    ``memory_reserved()``), in percent. What the process holds outside the allocator (the
    context, library handles, kernels loaded by the workload) is in both readings and cancels
    out. None without the three or when the allocator held nothing."""
    if before is None or asleep is None or not reserved_before:
        return None
    return 100.0 * (before - asleep) / reserved_before


def _difference(a: Optional[int], b: Optional[int]) -> Optional[int]:
    return None if a is None or b is None else a - b


def rate_gbps(nbytes: Optional[int], seconds: Optional[float]) -> Optional[float]:
    if not nbytes or not seconds or seconds <= 0:
        return None
    return nbytes / seconds / GB


def percent(part: Optional[float], whole: Optional[float]) -> Optional[float]:
    if part is None or not whole:
        return None
    return 100.0 * part / whole


def verdict(value: Optional[float], target: float) -> Optional[str]:
    if value is None:
        return None
    return "met" if value >= target else "not met"


def row(record: Dict[str, Any]) -> Dict[str, Any]:
    """The figures of one child's record (None where it did not get that far)."""
    source = memory_source(record)
    context = held(record.get("context"), source)
    before = held(record.get("before"), source)
    asleep = held(record.get("asleep"), source)
    woken = held(record.get("woken"), source)
    link = record.get("link") or {}
    live = record.get("live_bytes")
    sleeps = record.get("config") != NATIVE
    out: Dict[str, Any] = {
        "config": record.get("config"),
        "ok": bool(record.get("ok")),
        "error": record.get("error"),
        "stage": record.get("stage"),
        "memory_source": source,
        "context_bytes": context,
        "held_before_bytes": before,
        "live_bytes": live,
        "buffer_bytes": record.get("buffer_bytes"),
        "reserved_before_bytes": (record.get("before") or {}).get("reserved_bytes"),
        "link_d2h_gbps": link.get("d2h_gbps"),
        "link_h2d_gbps": link.get("h2d_gbps"),
    }
    if not sleeps:
        return out
    sleep_gbps = rate_gbps(live, record.get("sleep_s"))
    wake_gbps = rate_gbps(live, record.get("wake_s"))
    reserved_before = (record.get("before") or {}).get("reserved_bytes")
    gone = allocator_given_back_pct(before, asleep, reserved_before)
    sleep_link = percent(sleep_gbps, link.get("d2h_gbps"))
    wake_link = percent(wake_gbps, link.get("h2d_gbps"))
    second = record.get("second_cycle") or {}
    out.update({
        "held_asleep_bytes": asleep,
        "sleep_returned_bytes": record.get("sleep_returned"),
        "second_sleep_returned_bytes": second.get("sleep_returned"),
        "held_woken_bytes": woken,
        "given_back_pct": gone,
        "beyond_context_given_back_pct": given_back_pct(before, asleep, context),
        "outside_allocator_before_bytes": _difference(before, reserved_before),
        "sleep_s": record.get("sleep_s"),
        "reserve_s": record.get("reserve_s"),
        "reserved_bytes": record.get("reserved_bytes"),
        "wake_s": record.get("wake_s"),
        "sleep_gbps": sleep_gbps,
        "wake_gbps": wake_gbps,
        "sleep_link_pct": sleep_link,
        "wake_link_pct": wake_link,
        "second_sleep_s": second.get("sleep_s"),
        "second_wake_s": second.get("wake_s"),
        "second_sleep_link_pct": percent(rate_gbps(live, second.get("sleep_s")),
                                         link.get("d2h_gbps")),
        "second_wake_link_pct": percent(rate_gbps(live, second.get("wake_s")),
                                        link.get("h2d_gbps")),
        "second_given_back_pct": allocator_given_back_pct(
            held(second.get("before"), source), held(second.get("asleep"), source),
            (second.get("before") or {}).get("reserved_bytes")),
        "bitwise_equal": record.get("bitwise_equal"),
        "mismatches": record.get("mismatches") or [],
        "restore_equal": record.get("restore_equal"),
        "addresses_kept": record.get("addresses_kept"),
        "reference_repeatable": record.get("reference_repeatable"),
        "step_equal": record.get("step_equal"),
        "targets": {
            "given_back": verdict(gone, TARGET_GIVEN_BACK_PCT),
            "sleep_link": verdict(sleep_link, TARGET_LINK_PCT),
            "wake_link": verdict(wake_link, TARGET_LINK_PCT),
        },
    })
    return out


def exit_status(records: Dict[str, Dict[str, Any]]) -> int:
    """0 when every child ran to the end, else 1."""
    return 0 if records and all(r.get("ok") for r in records.values()) else 1


def build_report(records: Dict[str, Dict[str, Any]], meta: Dict[str, Any]) -> Dict[str, Any]:
    """sleep.json: the run's facts, each configuration's figures, and the records themselves."""
    rows = [row(records[c]) for c in records]
    failed = [{"config": r["config"], "stage": r["stage"], "error": r["error"]}
              for r in rows if not r["ok"]]
    return {
        "meta": meta,
        "targets": {"given_back_pct": TARGET_GIVEN_BACK_PCT, "link_pct": TARGET_LINK_PCT,
                    "tms_reported_given_back_pct": TMS_REPORTED_GIVEN_BACK_PCT},
        "rows": rows,
        "failed": failed,
        "exit_status": exit_status(records),
        "records": records,
    }


def gib(value: Optional[float]) -> str:
    return "—" if value is None else f"{value / GIB:.2f}"


def number(value: Optional[float], digits: int = 2, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def yes_no(value: Optional[bool]) -> str:
    return "—" if value is None else ("yes" if value else "no")


MARKS = {"met": " ✓", "not met": " ✗", None: ""}


def step_text(r: Dict[str, Any]) -> str:
    """Whether the step after wake equals the reference; "n/a" when the reference itself did not
    repeat (the step is not deterministic here)."""
    if r.get("reference_repeatable") is False:
        return "n/a (not repeatable)"
    return yes_no(r.get("step_equal"))


def _rate_cell(gbps: Optional[float], link_pct: Optional[float], status: Optional[str]) -> str:
    if gbps is None:
        return "—"
    return f"{gbps:.1f} ({number(link_pct, 0, '%')}){MARKS[status]}"


def _first(rows: List[Dict[str, Any]], key: str) -> Any:
    return next((r[key] for r in rows if r.get(key) is not None), None)


def render_markdown(report: Dict[str, Any]) -> str:
    """sleep.md: the table, the link, the failures, and how it was measured."""
    meta, rows = report["meta"], report["rows"]
    targets = report["targets"]
    facts = meta.get("facts") or {}
    lines = ["# Sleep and wake: streampool (vmm) against torch_memory_saver", ""]
    described = ", ".join(f"{k} {facts[k]}" for k in ("device", "torch", "cuda", "transformers",
                                                        "torch_memory_saver", "model")
                          if facts.get(k))
    if described:
        lines += [f"{described}; {meta.get('date', '')}.", ""]
    if meta.get("command"):
        lines += [f"Command: `{meta['command']}`", ""]
    lines += [
        "| configuration | context GiB | held before GiB | held asleep GiB | given back | "
        "sleep s | wake s | sleep GB/s (% of D2H) | wake GB/s (% of H2D) | state bitwise | "
        "step bitwise |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = f"`{r['config']}`"
        if not r["ok"] and r.get("held_before_bytes") is None:
            lines.append(f"| {name} | **failed** ({r.get('stage')}) |" + " |" * 9)
            continue
        failed = f" **failed** ({r.get('stage')})" if not r["ok"] else ""
        if "given_back_pct" not in r:  # native: the footprint only
            lines.append(f"| {name}{failed} | {gib(r['context_bytes'])} | "
                         f"{gib(r['held_before_bytes'])} | no sleep | | | | | | | |")
            continue
        t = r["targets"]
        lines.append(
            f"| {name}{failed} | {gib(r['context_bytes'])} | {gib(r['held_before_bytes'])} | "
            f"{gib(r['held_asleep_bytes'])} | "
            f"{number(r['given_back_pct'], 2, '%')}{MARKS[t['given_back']]} | "
            f"{number(r['sleep_s'], 3)} | {number(r['wake_s'], 3)} | "
            f"{_rate_cell(r['sleep_gbps'], r['sleep_link_pct'], t['sleep_link'])} | "
            f"{_rate_cell(r['wake_gbps'], r['wake_link_pct'], t['wake_link'])} | "
            f"{yes_no(r['bitwise_equal'])} | {step_text(r)} |"
        )
    live, buffer = _first(rows, "live_bytes"), _first(rows, "buffer_bytes")
    lines += [
        "",
        f"Targets: given back ≥ {targets['given_back_pct']:g}% (torch_memory_saver reported "
        f"{targets['tms_reported_given_back_pct']:g}%), sleep and wake ≥ "
        f"{targets['link_pct']:g}% of the host link (✓ met, ✗ not met).",
        "Given back = (held before − held asleep) ÷ the allocator's reserved bytes before "
        "(`torch.cuda.memory_reserved()`): of what the allocator held, the share that left the "
        "device; what the process holds outside the allocator (the context, library handles and "
        "kernels loaded by the workload: the table below) is in both readings. "
        f"GB/s = the workload's live tensor bytes ({gib(live)} GiB: parameters, optimizer state, "
        f"the {gib(buffer)} GiB inference buffer; the same for every configuration) ÷ the wall "
        "time of the "
        "sleep (wake), synchronised on both sides; 1 GB = 1e9 bytes.",
        "",
        "| configuration | memory source | reserved before GiB | outside the allocator before "
        "GiB | given back beyond the context | host link D2H / H2D GB/s | "
        "2nd cycle sleep / wake s | 2nd cycle given back | addresses kept | restore bitwise | "
        "reference repeatable |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        link = f"{number(r.get('link_d2h_gbps'), 1)} / {number(r.get('link_h2d_gbps'), 1)}"
        if "given_back_pct" not in r:
            lines.append(f"| `{r['config']}` | {r['memory_source']} | "
                         f"{gib(r.get('reserved_before_bytes'))} | | | {link} | | | | | |")
            continue
        lines.append(
            f"| `{r['config']}` | {r['memory_source']} | {gib(r.get('reserved_before_bytes'))} | "
            f"{gib(r.get('outside_allocator_before_bytes'))} | "
            f"{number(r.get('beyond_context_given_back_pct'), 2, '%')} | "
            f"{link} | {number(r['second_sleep_s'], 3)} / {number(r['second_wake_s'], 3)} | "
            f"{number(r['second_given_back_pct'], 2, '%')} | {yes_no(r['addresses_kept'])} | "
            f"{yes_no(r['restore_equal'])} | "
            f"{yes_no(r['reference_repeatable'])} |"
        )
    mismatched = [r for r in rows if r.get("mismatches")]
    if mismatched:
        lines += ["", "Tensors that differ after wake:"]
        for r in mismatched:
            lines.append(f"- `{r['config']}`: {', '.join(r['mismatches'])}")
    if report["failed"]:
        lines += ["", "Failures:"]
        for f in report["failed"]:
            error = (f.get("error") or "no record").strip().replace("\n", "\n    ")
            lines.append(f"- `{f['config']}` at stage `{f['stage']}`:\n\n    {error}\n")
    lines += ["", "Configurations:"]
    lines += [f"- `{r['config']}`: {DESCRIPTIONS.get(r['config'], '')}" for r in rows]
    lines += [
        "",
        "Memory source: `nvml-process` is this process's device memory as NVML lists it; "
        "`device-used` (where NVML lists no process, as in many containers) is the whole "
        "device's total − free, so another process on the GPU would count too. The context is "
        "read after CUDA started, a tiny tensor was allocated and freed and the cache emptied. "
        "Library handles and kernels loaded during the workload stay in the process (no "
        "allocator can give them back). Method and code: `bench/sleep.py`.",
        "",
    ]
    return "\n".join(lines)


def summary_lines(report: Dict[str, Any]) -> List[str]:
    """One line per configuration, for the end of the run's output."""
    lines = []
    for r in report["rows"]:
        name = r["config"]
        if not r["ok"] and r.get("held_before_bytes") is None:
            lines.append(f"{name}: FAILED at {r.get('stage')}: "
                         f"{protocol.tail(r.get('error') or '', 1)}")
            continue
        mark = "" if r["ok"] else f" (FAILED at {r.get('stage')})"
        if "given_back_pct" not in r:
            lines.append(f"{name}: held {gib(r['held_before_bytes'])} GiB (context "
                         f"{gib(r['context_bytes'])} GiB), no sleep{mark}")
            continue
        lines.append(
            f"{name}: held {gib(r['held_before_bytes'])} -> {gib(r['held_asleep_bytes'])} GiB, "
            f"given back {number(r['given_back_pct'], 2, '%')} of the allocator's "
            f"{gib(r.get('reserved_before_bytes'))} GiB (outside it "
            f"{gib(r.get('outside_allocator_before_bytes'))} GiB), sleep {number(r['sleep_s'], 3)} s, "
            f"wake {number(r['wake_s'], 3)} s, {number(r['sleep_gbps'], 1)} / "
            f"{number(r['wake_gbps'], 1)} GB/s ({number(r['sleep_link_pct'], 0, '%')} / "
            f"{number(r['wake_link_pct'], 0, '%')} of link)"
            + ("" if r.get("reserve_s") is None else
               f", its buffer ({gib(r.get('reserved_bytes'))} GiB) reserved ahead in "
               f"{number(r['reserve_s'], 3)} s")
            + "; second cycle sleep "
            f"{number(r.get('second_sleep_s'), 3)} s, wake {number(r.get('second_wake_s'), 3)} s "
            f"({number(r.get('second_sleep_link_pct'), 0, '%')} / "
            f"{number(r.get('second_wake_link_pct'), 0, '%')} of link); bitwise equal "
            f"{yes_no(r['bitwise_equal'])}, step equal {step_text(r)}{mark}"
        )
    return lines


def headline_text(report: Dict[str, Any]) -> Optional[str]:
    """One sentence for README's first screen: what streampool's sleep gave back and how long
    sleep and wake took, beside torch_memory_saver's where it ran; None without a streampool row
    that ran to the end."""
    rows = {r["config"]: r for r in report.get("rows", [])}
    mine = next((rows[c] for c in (STREAMPOOL_RESERVED, STREAMPOOL)
                 if c in rows and rows[c]["ok"] and rows[c].get("given_back_pct") is not None),
                None)
    if mine is None:
        return None

    def figures(r: Dict[str, Any], note: str = "") -> str:
        return (f"gave back {number(r['given_back_pct'], 1, '%')} of the allocator's memory, "
                f"slept in {number(r['sleep_s'], 2)} s{note} and woke in "
                f"{number(r['wake_s'], 2)} s")

    # The reserved row's sleep copies into a buffer pinned ahead: say so, and what a plain
    # sleep() took, so that the figure is not read as the plain call's.
    note = ""
    if mine["config"] == STREAMPOOL_RESERVED:
        plain = rows.get(STREAMPOOL)
        without = (f"; {number(plain['sleep_s'], 2)} s without"
                   if plain and plain["ok"] and plain.get("sleep_s") is not None else "")
        note = f" (its host buffer pinned ahead by `streampool.reserve_sleep_buffer()`{without})"

    text = (f"`streampool.sleep()` on `vmm`, with GPT-2's training state "
            f"({gib(mine.get('live_bytes'))} GiB of tensors), {figures(mine, note)}")
    if mine.get("bitwise_equal"):
        text += ", every tensor bit for bit the same after"
    tms = rows.get(TMS)
    if tms and tms["ok"] and tms.get("given_back_pct") is not None:
        text += f"; torch_memory_saver {figures(tms)}"
    return text + "."
