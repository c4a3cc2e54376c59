"""PyTorch's allocator settings (``PYTORCH_CUDA_ALLOC_CONF``, ``PYTORCH_ALLOC_CONF``,
``torch.cuda.memory._set_allocator_settings``) under ``install()``.

They configure PyTorch's own caching allocator, which streampool replaces: PyTorch still parses
them (and refuses malformed ones), but the keys of its caching allocator no longer do anything.
Each such key gets one warning line naming it and what to do instead; the keys of PyTorch's
pinned host allocator (``pinned_*``) still work and get none.

Invariant: a key is warned about at most once per process; nothing here changes a setting.
"""

import logging
import threading
from typing import Any, Callable, List, Set, Tuple

_log = logging.getLogger("streampool")

# PyTorch's variables, newest name first (torch 2.9 renamed PYTORCH_CUDA_ALLOC_CONF, which it still reads).
VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")

# key -> what to do instead under streampool (keys of PyTorch's caching allocator).
UNHONOURED = {
    "expandable_segments": "streampool's virtual-memory backend, its default, is its counterpart: "
    "nothing to set (STREAMPOOL_BACKEND=vmm)",
    "max_split_size_mb": "streampool does not split cached blocks; STREAMPOOL_CACHE_MAX_BLOCK "
    "sets the largest freed block it caches",
    "roundup_power2_divisions": "streampool rounds every request to 512 B; there is no counterpart",
    "max_non_split_rounding_mb": "streampool does not split cached blocks; there is no counterpart",
    "garbage_collection_threshold": "streampool gives unused memory back by itself: "
    "STREAMPOOL_RELEASE_THRESHOLD and STREAMPOOL_IDLE_RELEASE set when",
    "per_process_memory_fraction": "call torch.cuda.set_per_process_memory_fraction() after "
    "install(): streampool enforces it",
    "backend": "streampool is the allocator: the setting is ignored (its pool backend, "
    "STREAMPOOL_BACKEND=pool, uses the driver's stream-ordered pools, as cudaMallocAsync does)",
    "release_lock_on_cudamalloc": "streampool makes its driver calls outside its locks; there is "
    "no counterpart",
    "graph_capture_record_stream_reuse": "streampool's CUDA graph pools follow record_stream "
    "always; there is no counterpart",
}

_warned: Set[str] = set()
_lock = threading.Lock()


def _pairs(text: str) -> List[Tuple[str, str]]:
    """``key:value`` pairs of a setting string; commas inside brackets (as in
    ``roundup_power2_divisions:[256:1,>:4]``) do not separate pairs."""
    pairs, depth, start = [], 0, 0
    for i, ch in enumerate(text + ","):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            item = text[start:i].strip()
            start = i + 1
            if item:
                key, _, value = item.partition(":")
                pairs.append((key.strip(), value.strip()))
    return pairs


def unhonoured(text: str) -> List[Tuple[str, str, str]]:
    """(key, value, what to do instead) for each key of ``text`` streampool does not honour."""
    found = []
    for key, value in _pairs(text):
        if key.startswith("pinned_"):
            continue  # PyTorch's pinned host allocator: still PyTorch's, still works
        advice = UNHONOURED.get(key, "it is not a key of PyTorch's that streampool knows")
        found.append((key, value, advice))
    return found


def _warn(where: str, text: str) -> List[str]:
    """One warning per unhonoured key not warned about yet; returns the keys warned about now."""
    warned = []
    for key, value, advice in unhonoured(text):
        with _lock:
            if key in _warned:
                continue
            _warned.add(key)
        _log.warning("streampool: %s sets %s:%s, which streampool does not honour: %s", where, key, value, advice)
        warned.append(key)
    return warned


def warn_environment(environ: Any) -> List[str]:
    """At install(): a warning per key of PyTorch's allocator variables set in ``environ`` that
    streampool does not honour; returns those keys."""
    warned = []
    for name in VARIABLES:
        text = environ.get(name)
        if text:
            warned += _warn(name, text)
    return warned


def set_allocator_settings(original: Callable[[str], Any]) -> Callable[[str], Any]:
    """``torch._C._cuda_cudaCachingAllocator_set_allocator_settings`` under streampool: PyTorch's
    own call (which parses and refuses malformed settings), then a warning per key streampool
    does not honour."""

    def set_settings(settings: str) -> Any:
        result = original(settings)
        _warn("torch.cuda.memory._set_allocator_settings", str(settings))
        return result

    set_settings.__doc__ = set_allocator_settings.__doc__
    return set_settings


def forget_warnings() -> None:
    """Warn again about keys already warned about (for tests)."""
    with _lock:
        _warned.clear()
