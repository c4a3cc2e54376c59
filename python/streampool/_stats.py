"""streampool's counters under PyTorch's ``memory_stats()`` names, and a readable summary table."""

from typing import Dict, List, Sequence, Tuple

from ._lib import StreampoolStats

# PyTorch key -> StreampoolStats field. All byte counts are bytes, all others counts.
TORCH_KEYS = {
    "allocated_bytes.all.current": "allocated_bytes",
    "allocated_bytes.all.peak": "allocated_bytes_peak",
    "allocated_bytes.all.allocated": "allocated_bytes_total",
    "allocated_bytes.all.freed": "freed_bytes_total",
    "reserved_bytes.all.current": "reserved_bytes",
    "reserved_bytes.all.peak": "reserved_bytes_peak",
    "active_bytes.all.current": "active_bytes",
    "active_bytes.all.peak": "active_bytes_peak",
    "allocation.all.current": "allocations_current",
    "allocation.all.peak": "allocations_peak",
    "allocation.all.allocated": "num_allocs",
    "allocation.all.freed": "num_frees",
    "num_alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
    "num_device_alloc": "num_device_allocs",
    "num_device_free": "num_device_frees",
}

# streampool's own keys -> StreampoolStats field.
OWN_KEYS = {
    "cached_bytes": "cached_bytes",
    "cache_hits": "num_cache_hits",
    "pool_used_bytes": "pool_used_bytes",
    "memory_limit_bytes": "memory_limit_bytes",
    "device_total_bytes": "device_total_bytes",
    "ipc_reserved_bytes": "ipc_reserved_bytes",
    "ipc_used_bytes": "ipc_used_bytes",
    "num_growth_syncs": "num_growth_syncs",
    "num_maps": "num_maps",
    "num_unmaps": "num_unmaps",
    "num_mem_creates": "num_mem_creates",
    "num_mem_releases": "num_mem_releases",
    "num_set_access_calls": "num_set_access_calls",
    "num_stream_waits": "num_stream_waits",
    "num_idle_releases": "num_idle_releases",
}


def stats_dict(stats: StreampoolStats, reserved_total: Tuple[int, int]) -> Dict[str, int]:
    """PyTorch-named statistics plus streampool's own, sorted by key like torch.cuda.memory_stats.
    The reserved bytes are PyTorch's (``reserved_total``: current and peak of all the device holds
    from CUDA, the shareable pool and graph memory included), not the pools' alone."""
    keys = {**TORCH_KEYS, **OWN_KEYS}
    figures = {key: int(getattr(stats, keys[key])) for key in keys}
    figures["reserved_bytes.all.current"], figures["reserved_bytes.all.peak"] = reserved_total
    return {key: figures[key] for key in sorted(figures)}


# ``memory_limit_bytes`` when no limit is set (UINT64_MAX); 0 is a cap of 0 bytes.
NO_LIMIT = (1 << 64) - 1


def format_limit(limit: int) -> str:
    """``memory_limit_bytes`` for people: ``"none"`` for no limit, else bytes (``"0 B"`` for a cap of 0)."""
    return "none" if limit == NO_LIMIT else format_bytes(limit)


def format_bytes(count: int) -> str:
    """``1536`` -> ``"1.50 KiB"``; below 1 KiB exact bytes (``"511 B"``)."""
    if count < 1024:
        return f"{count} B"
    value = float(count)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024.0
        if value < 1024.0 or unit == "PiB":
            return f"{value:.2f} {unit}"
    raise AssertionError("unreachable")


# Column widths (characters) of the summary's two tables; both make 80-character lines.
_COUNTER_WIDTHS = (22, 10, 10, 11, 11)
_FACT_WIDTHS = (24, 12, 20, 15)


def _row(cells: Sequence[str], widths: Sequence[int]) -> str:
    first, *rest = cells
    parts = [f" {first:<{widths[0]}} "] + [f" {cell:>{w}} " for cell, w in zip(rest, widths[1:])]
    return "|" + "|".join(parts) + "|"


def _fact_row(cells: Sequence[str]) -> str:
    """Two "label value" pairs side by side."""
    label1, value1, label2, value2 = cells
    w1, v1, w2, v2 = _FACT_WIDTHS
    return f"| {label1:<{w1}} {value1:>{v1}} | {label2:<{w2}} {value2:>{v2}} |"


def summary(device: int, driver: str, stats: StreampoolStats, reserved_total: Tuple[int, int]) -> str:
    """A multi-line table of ``stats`` (one device) in human units, like torch.cuda.memory_summary;
    reserved memory is ``reserved_total`` (current, peak: ``memory_reserved()``'s figures)."""
    b = format_bytes
    s = stats
    counters: List[Sequence[str]] = [
        ("Metric", "Current", "Peak", "Total alloc", "Total freed"),
        ("Allocated memory", b(s.allocated_bytes), b(s.allocated_bytes_peak),
         b(s.allocated_bytes_total), b(s.freed_bytes_total)),
        ("Active memory", b(s.active_bytes), b(s.active_bytes_peak), "", ""),
        ("Reserved memory", b(reserved_total[0]), b(reserved_total[1]), "", ""),
        ("Allocations", str(s.allocations_current), str(s.allocations_peak),
         str(s.num_allocs), str(s.num_frees)),
    ]
    limit = format_limit(s.memory_limit_bytes)
    facts = [
        ("Cached, ready for reuse", b(s.cached_bytes), "Pool used", b(s.pool_used_bytes)),
        ("Cache hits", str(s.num_cache_hits), "Alloc retries", str(s.num_alloc_retries)),
        ("Device allocs", str(s.num_device_allocs), "Device frees", str(s.num_device_frees)),
        ("Out-of-memory errors", str(s.num_ooms), "Memory limit", limit),
        ("Device total", b(s.device_total_bytes), "", ""),
    ]
    header = _row(counters[0], _COUNTER_WIDTHS)
    inner = len(header) - 2
    rule, thin = "|" + "=" * inner + "|", "|" + "-" * inner + "|"
    title = f"streampool memory summary, device {device} (driver {driver})"
    lines = [rule, "|" + title.center(inner) + "|", thin, header, thin]
    lines += [_row(row, _COUNTER_WIDTHS) for row in counters[1:]]
    lines.append(thin)
    lines += [_fact_row(row) for row in facts]
    lines.append(rule)
    return "\n".join(lines)
