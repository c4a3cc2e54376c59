"""ctypes binding of ``libstreampool.so``: finding and loading it, the C signatures, status codes.

The C ABI is described in ``docs/abi.md``; this module mirrors it one to one. Nothing here needs
PyTorch. The library is loaded once per process, on first use, so ``STREAMPOOL_*`` variables set
before that first use are the ones the library sees.
"""

import ctypes
import operator
import os
import threading
from pathlib import Path
from typing import Dict, List, Optional, Tuple

LIBRARY_ENV = "STREAMPOOL_LIBRARY"
LIBRARY_NAME = "libstreampool.so"

_PACKAGE_DIR = Path(__file__).resolve().parent
# python/streampool/_lib.py -> <repo>/target/release/libstreampool.so in a development checkout.
_CHECKOUT_LIBRARY = _PACKAGE_DIR.parent.parent / "target" / "release" / LIBRARY_NAME

# Status codes (docs/abi.md).
OK = 0
INVALID_ARGUMENT = -1
OUT_OF_MEMORY = -2
UNKNOWN_POINTER = -3
CONFIG_ERROR = -4
DRIVER_ERROR = -5
DRIVER_UNAVAILABLE = -6
INTERNAL_ERROR = -7

# The names of include/streampool.h's enum StreampoolStatus.
STATUS_NAMES = {
    OK: "STREAMPOOL_STATUS_OK",
    INVALID_ARGUMENT: "STREAMPOOL_STATUS_INVALID_ARGUMENT",
    OUT_OF_MEMORY: "STREAMPOOL_STATUS_OUT_OF_MEMORY",
    UNKNOWN_POINTER: "STREAMPOOL_STATUS_UNKNOWN_POINTER",
    CONFIG_ERROR: "STREAMPOOL_STATUS_CONFIG_ERROR",
    DRIVER_ERROR: "STREAMPOOL_STATUS_DRIVER_ERROR",
    DRIVER_UNAVAILABLE: "STREAMPOOL_STATUS_DRIVER_UNAVAILABLE",
    INTERNAL_ERROR: "STREAMPOOL_STATUS_INTERNAL_ERROR",
}


class StreampoolError(RuntimeError):
    """A libstreampool call failed. ``status`` is the C status code (``None`` when the call
    reports failure by returning NULL), the message is the library's ``streampool_last_error()``."""

    def __init__(self, message: str, status: Optional[int] = None):
        super().__init__(message)
        self.status = status


class InvalidArgumentError(StreampoolError, ValueError):
    """Bad size, device index, fraction or pointer argument."""


class OutOfMemoryError(StreampoolError):
    """The pool could not serve a request; the message starts with "CUDA out of memory."."""


class UnknownPointerError(StreampoolError):
    """A free or record_stream of a pointer streampool does not own."""


class ConfigError(StreampoolError):
    """A ``STREAMPOOL_*`` variable or install() option is malformed."""


class DriverError(StreampoolError):
    """A CUDA driver call failed, or no usable CUDA driver was found."""


class LibraryError(StreampoolError, OSError):
    """The file found for ``libstreampool.so`` cannot be loaded, or is not libstreampool."""


# Shown (in tracebacks, repr, pickles) under their public path, streampool.ConfigError and so on.
for _error_class in (StreampoolError, InvalidArgumentError, OutOfMemoryError, UnknownPointerError,
                     ConfigError, DriverError, LibraryError):
    _error_class.__module__ = "streampool"

_ERROR_CLASSES = {
    INVALID_ARGUMENT: InvalidArgumentError,
    OUT_OF_MEMORY: OutOfMemoryError,
    UNKNOWN_POINTER: UnknownPointerError,
    CONFIG_ERROR: ConfigError,
    DRIVER_ERROR: DriverError,
    DRIVER_UNAVAILABLE: DriverError,
}

from ._abi import (  # noqa: F401  (re-exported: the package and its tests use them from here)
    BLOCK_STATES,
    EVENT_KINDS,
    STATS_FIELDS,
    StreampoolBlock,
    StreampoolEvent,
    StreampoolIpcHandle,
    StreampoolIpcPages,
    StreampoolPoolBlock,
    StreampoolStats,
    _NEWER_EXPORTS,
    _SIGNATURES,
)
from ._config import c_text_problem, name_the_option

_load_lock = threading.Lock()
_library: Optional[ctypes.CDLL] = None
_library_path: Optional[Path] = None
_environment_at_load: Optional[Dict[str, str]] = None


def find_library() -> Path:
    """The path of ``libstreampool.so``: ``$STREAMPOOL_LIBRARY``, else the copy inside the package,
    else ``<checkout>/target/release/libstreampool.so``. Raises FileNotFoundError naming all three
    (or the variable, set but empty)."""
    configured = os.environ.get(LIBRARY_ENV)
    if configured is not None and not configured.strip():
        raise FileNotFoundError(f"{LIBRARY_ENV} is set but empty: name the {LIBRARY_NAME} to load, or unset it")
    if configured:
        path = Path(configured).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f"{LIBRARY_ENV}={configured} does not name a file")
        return path
    for candidate in (_PACKAGE_DIR / LIBRARY_NAME, _CHECKOUT_LIBRARY):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{LIBRARY_NAME} not found: set {LIBRARY_ENV}, install the package with pip "
        f"(which builds it into {_PACKAGE_DIR}), or run `cargo build --release` in the checkout "
        f"(looked for {_CHECKOUT_LIBRARY})"
    )


def _loaded() -> ctypes.CDLL:
    """The loaded library with every signature declared (loaded on the first call), the
    ``STREAMPOOL_*`` variables not recorded: for the calls that read none of them (the version,
    the last error, a check that keeps nothing)."""
    global _library, _library_path
    with _load_lock:
        if _library is None:
            path = find_library()
            lib = _load(path)
            for name, (restype, argtypes) in _SIGNATURES.items():
                if name in _NEWER_EXPORTS and not hasattr(lib, name):
                    continue  # an older library (a benchmark's A/B against the last release)
                function = getattr(lib, name)
                function.restype = restype
                function.argtypes = argtypes
            _library_path = path
            _library = lib
        return _library


def library() -> ctypes.CDLL:
    """The loaded library (:func:`_loaded`) for a call that may read the ``STREAMPOOL_*``
    variables: records them on the first such call, and on the first after forget_environment()."""
    global _environment_at_load
    lib = _loaded()
    with _load_lock:
        if _environment_at_load is None:
            _environment_at_load = streampool_environment()
    return lib


def _origin(path: Path) -> str:
    """How ``path`` was chosen, for messages: the variable and its value, or the path."""
    configured = os.environ.get(LIBRARY_ENV)
    return f"{LIBRARY_ENV}={configured}" if configured else str(path)


def _load(path: Path) -> ctypes.CDLL:
    """``path`` loaded, or LibraryError in one line if it is no shared library or not libstreampool
    (a library missing one of the exports this package declares)."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        reason = str(exc).replace(f"{path}: ", "")
        raise LibraryError(
            f"{_origin(path)} cannot be loaded ({reason}): expected a {LIBRARY_NAME} from this "
            "package, the wheel or `cargo build --release`"
        ) from None
    missing = [name for name in _SIGNATURES if name not in _NEWER_EXPORTS and not hasattr(lib, name)]
    if missing:
        raise LibraryError(
            f"{_origin(path)} is not {LIBRARY_NAME}: it lacks {missing[0]}"
            + (f" and {len(missing) - 1} more exports" if len(missing) > 1 else "")
            + f"; expected a {LIBRARY_NAME} from this package, the wheel or `cargo build --release`"
        )
    return lib


def is_loaded() -> bool:
    return _library is not None


def library_path() -> Path:
    """The path the library was loaded from, or would be loaded from."""
    return _library_path if _library_path is not None else find_library()


def streampool_environment() -> Dict[str, str]:
    """The ``STREAMPOOL_*`` variables of the process environment now."""
    return {k: v for k, v in os.environ.items() if k.startswith("STREAMPOOL_")}


def environment_at_load() -> Optional[Dict[str, str]]:
    """The ``STREAMPOOL_*`` variables as they were when the library was loaded; None before that,
    and after :func:`forget_environment` until the next use."""
    return None if _environment_at_load is None else dict(_environment_at_load)


def forget_environment() -> None:
    """Mark the variables as not read yet: for install(), when only ``check_config()`` (which
    keeps nothing it parses) has seen values it then took back. The next use records them."""
    global _environment_at_load
    with _load_lock:
        _environment_at_load = None


def function_address(name: str) -> int:
    """The address of exported C function ``name``, for PyTorch's hook setters."""
    return ctypes.cast(getattr(library(), name), ctypes.c_void_p).value


def last_error() -> str:
    """This thread's last error message from the library ("" if none)."""
    message = _loaded().streampool_last_error()
    return message.decode("utf-8", errors="replace") if message else ""


def error(status: Optional[int], fallback: str) -> StreampoolError:
    """The exception for a failed call, carrying the library's message (``fallback`` if empty)."""
    message = last_error() or fallback
    return _ERROR_CLASSES.get(status, StreampoolError)(message, status)


def check(status: int) -> None:
    """Raise the matching StreampoolError if ``status`` is not STREAMPOOL_OK."""
    if status != OK:
        name = STATUS_NAMES.get(status, f"unknown status {status}")
        raise error(status, f"streampool call failed with {name}")


def call_reporting(name: str, *args: object) -> None:
    """Call export ``name``, which returns nothing and reports failure only through
    ``streampool_last_error()``; raise the StreampoolError it reports. The message is cleared
    first by a successful ``streampool_device_count()`` (which raises if the library cannot start)."""
    device_count()
    getattr(library(), name)(*args)
    message = last_error()
    if message:
        status = OUT_OF_MEMORY if message.startswith("CUDA out of memory.") else None
        raise _ERROR_CLASSES.get(status, StreampoolError)(message, status)


def _decode(raw: Optional[bytes]) -> str:
    return raw.decode("utf-8", errors="replace") if raw else ""


def version() -> str:
    return _decode(_loaded().streampool_version())


def driver_name() -> str:
    """"cuda" or "sim"; raises ConfigError if a STREAMPOOL_* variable is malformed."""
    name = _decode(library().streampool_driver_name())
    if name == "invalid":
        check_config()
    return name


def c_text(text: str, what: str, config: bool = False) -> bytes:
    """``text`` as the library takes a C string: UTF-8, no NUL (C would read up to it and drop the
    rest). A NUL, or text that is not UTF-8, raises InvalidArgumentError (ConfigError where
    ``config``: a setting's value) naming ``what`` and the value; the library is not called."""
    problem = c_text_problem(text)
    if problem is None:
        return text.encode("utf-8")
    status = CONFIG_ERROR if config else INVALID_ARGUMENT
    named = f"{what}{text!r}" if what.endswith("=") else f"{what} {text!r}"
    raise _ERROR_CLASSES[status](f"{named} {problem}", status)


def check_setting(name: str, value: str) -> None:
    """Raise ConfigError (naming the variable, the value and what is accepted) unless the library
    takes ``value`` for ``name``, as if it were the only ``STREAMPOOL_*`` variable set: the
    library's own parser; the environment is neither read nor changed, and nothing is kept. A
    library older than this check checks nothing here (it checks the value where it is used)."""
    function = getattr(_loaded(), "streampool_check_setting", None)
    if function is not None:
        check(function(c_text(name, "variable", True), c_text(value, f"{name}=", True)))


def check_config() -> None:
    """Parse the ``STREAMPOOL_*`` variables now; raise ConfigError naming a malformed one (the
    install() option that set it, where one did: _config.name_the_option)."""
    try:
        check(library().streampool_check_config())
    except ConfigError as exc:
        named = name_the_option(str(exc))
        if named == str(exc):
            raise
        raise ConfigError(named, exc.status) from None


def device_count() -> int:
    count = library().streampool_device_count()
    if count < 0:
        check(count)
    return count


def device_flag(name: str, device: int) -> bool:
    """The yes/no answer of export ``name`` (1 / 0) for ``device``; raises on a negative status."""
    function = getattr(library(), name, None)
    if function is None:
        raise StreampoolError(f"{library_path()} predates {name}: use a newer libstreampool")
    answer = function(device)
    if answer < 0:
        check(answer)
    return bool(answer)


def get_stats(device: int) -> StreampoolStats:
    stats = StreampoolStats()
    check(library().streampool_get_stats(device, ctypes.byref(stats)))
    return stats


def parse_bytes(spec: str, device: int) -> int:
    """Bytes meant by ``spec`` ("8GiB", "512MB", "80%" of device memory, "max") on ``device``."""
    out = ctypes.c_uint64()
    check(library().streampool_parse_bytes(c_text(spec, "size"), device, ctypes.byref(out)))
    return out.value


def malloc(size: int, device: int, stream: Optional[int] = None) -> Optional[int]:
    """``streampool_malloc``: the device address of ``size`` bytes allocated on ``stream``
    (None = legacy default stream). Size 0 gives None. Failure raises StreampoolError; a negative
    size (which ctypes would turn into a size near 2**64) raises InvalidArgumentError."""
    size = check_size(size)
    ptr = library().streampool_malloc(size, device, stream)
    if ptr is None and size > 0:
        # A NULL return carries no status code: the message tells the kind (sizes above
        # MAX_ALLOCATION_BYTES are out of memory too, as PyTorch reports them).
        message = last_error()
        status: Optional[int] = None
        if message.startswith("CUDA out of memory."):
            status = OUT_OF_MEMORY
        raise error(status, f"streampool_malloc({size}, device={device}) returned NULL")
    return ptr


# The largest size the library passes on (STREAMPOOL_MAX_ALLOCATION_BYTES in the header); larger
# sizes are out of memory.
MAX_ALLOCATION_BYTES = 1 << 48


def check_size(size: int) -> int:
    """``size`` as an int if a ``size_t`` holds it as it is, else InvalidArgumentError: ctypes
    would wrap -1 to 2**64 - 1 and truncate 2**64 to 0. TypeError if it is not an integer.
    (Sizes above MAX_ALLOCATION_BYTES the library refuses as out of memory, as PyTorch does.)"""
    try:
        size = operator.index(size)
    except TypeError:
        raise TypeError(f"allocation size must be an int (bytes), not {type(size).__name__}") from None
    if size < 0:
        raise InvalidArgumentError(f"allocation size must not be negative, got {size}", INVALID_ARGUMENT)
    if size >= 2**64:
        raise InvalidArgumentError(f"allocation size must be below 2**64 bytes, got {size}", INVALID_ARGUMENT)
    return size


def free(ptr: Optional[int], size: int, device: int, stream: Optional[int] = None) -> None:
    """``streampool_free`` of a pointer from :func:`malloc` (same size, device and stream)."""
    check(library().streampool_free(ptr, size, device, stream))


def history() -> Tuple[List[StreampoolEvent], int]:
    """The recorded timeline events, oldest first, and how many the full ring dropped."""
    count, dropped = ctypes.c_size_t(), ctypes.c_uint64()
    check(library().streampool_history(None, 0, ctypes.byref(count), None))
    events = (StreampoolEvent * count.value)()
    check(library().streampool_history(events, count.value, ctypes.byref(count), ctypes.byref(dropped)))
    return list(events[: count.value]), dropped.value


def blocks(device: int) -> List[StreampoolBlock]:
    """The blocks ``device`` holds from its pool."""
    count = ctypes.c_size_t()
    check(library().streampool_blocks(device, None, 0, ctypes.byref(count)))
    out = (StreampoolBlock * count.value)()
    check(library().streampool_blocks(device, out, count.value, ctypes.byref(count)))
    return list(out[: count.value])


def reserved_total(device: int) -> Tuple[int, int]:
    """(current, peak) bytes ``device`` holds from CUDA in all: what a snapshot's segments add up
    to (``torch.cuda.memory_reserved()`` under install())."""
    current, peak = ctypes.c_uint64(), ctypes.c_uint64()
    check(library().streampool_reserved_total(device, ctypes.byref(current), ctypes.byref(peak)))
    return current.value, peak.value


# How many times stats_with_reserved reads again while other threads allocate or free.
CONSISTENT_READS = 64


def stats_with_reserved(device: int) -> Tuple[StreampoolStats, Tuple[int, int]]:
    """``get_stats`` and ``reserved_total`` of ``device`` as of one moment: read again (up to
    CONSISTENT_READS times) while an allocation or a free completes between the two: the
    reserved bytes read after a free's memory went back, or before an allocation's was held,
    would pair with allocated bytes that still, or already, count it — reserved below allocated.
    (Each figure alone is exact whenever no allocation runs meanwhile.)"""
    stats = get_stats(device)
    for _ in range(CONSISTENT_READS):
        reserved = reserved_total(device)
        after = get_stats(device)
        if (after.num_allocs, after.num_frees) == (stats.num_allocs, stats.num_frees):
            return stats, reserved
        stats = after
    return stats, reserved_total(device)


def history_with_contexts() -> Tuple[List[StreampoolEvent], List[int], int]:
    """The recorded events, oldest first, each event's stack context (0: none), and how many
    events the full ring dropped."""
    count, dropped = ctypes.c_size_t(), ctypes.c_uint64()
    function = library().streampool_history_contexts
    check(function(None, None, 0, ctypes.byref(count), None))
    capacity = count.value + 64  # events recorded meanwhile: the newest that fit are copied
    events, contexts = (StreampoolEvent * capacity)(), (ctypes.c_uint64 * capacity)()
    check(function(events, contexts, capacity, ctypes.byref(count), ctypes.byref(dropped)))
    n = count.value
    return list(events[:n]), list(contexts[:n]), dropped.value


def live_contexts(device: int) -> Dict[int, int]:
    """address -> stack context of ``device``'s live blocks allocated with one while recording."""
    function = library().streampool_history_live_contexts
    count = ctypes.c_size_t(0)
    while True:
        capacity = count.value + 16
        out = (ctypes.c_uint64 * (2 * capacity))()
        check(function(device, out, capacity, ctypes.byref(count)))
        if count.value <= capacity:
            return {out[2 * i]: out[2 * i + 1] for i in range(count.value)}
