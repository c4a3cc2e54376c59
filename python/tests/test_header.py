"""The ctypes declarations of streampool._lib against the C header include/streampool.h.

A mismatch here (a new export, a changed argument type, a reordered stats field) would make ctypes
pass or read garbage without any error, so the header is the reference.
"""

import ctypes
import re
from pathlib import Path

from streampool import _lib

HEADER = Path(__file__).resolve().parents[2] / "include" / "streampool.h"

C_TYPES = {
    "void": None,
    "void *": ctypes.c_void_p,
    "int": ctypes.c_int,
    "double": ctypes.c_double,
    "ssize_t": ctypes.c_ssize_t,
    "size_t": ctypes.c_size_t,
    "uint64_t": ctypes.c_uint64,
    "uint64_t *": ctypes.POINTER(ctypes.c_uint64),
    "const char *": ctypes.c_char_p,
    "const char *const *": ctypes.POINTER(ctypes.c_char_p),
    "size_t *": ctypes.POINTER(ctypes.c_size_t),
    "struct StreampoolStats *": ctypes.POINTER(_lib.StreampoolStats),
    "struct StreampoolEvent *": ctypes.POINTER(_lib.StreampoolEvent),
    "struct StreampoolBlock *": ctypes.POINTER(_lib.StreampoolBlock),
    "struct StreampoolIpcHandle *": ctypes.POINTER(_lib.StreampoolIpcHandle),
    "const struct StreampoolIpcHandle *": ctypes.POINTER(_lib.StreampoolIpcHandle),
    "struct StreampoolIpcPages *": ctypes.POINTER(_lib.StreampoolIpcPages),
    "const struct StreampoolIpcPages *": ctypes.POINTER(_lib.StreampoolIpcPages),
    "int *": ctypes.POINTER(ctypes.c_int),
    "const int *": ctypes.POINTER(ctypes.c_int),
    "void * *": ctypes.POINTER(ctypes.c_void_p),
    "struct StreampoolPoolBlock *": ctypes.POINTER(_lib.StreampoolPoolBlock),
    "const uint64_t *": ctypes.POINTER(ctypes.c_uint64),
    "const void *": ctypes.c_void_p,
}
C_FIELD_TYPES = {"uint64_t": ctypes.c_uint64, "uint32_t": ctypes.c_uint32, "int32_t": ctypes.c_int32}


def _header_code() -> str:
    """The header without comments and preprocessor lines."""
    text = HEADER.read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"^\s*#[^\n]*", "", text, flags=re.M)
    return re.sub(r"//[^\n]*", "", text)


def _normalise(c_type: str) -> str:
    return re.sub(r"\s*\*", " *", " ".join(c_type.split())).strip()


def _split_declaration(parameter: str):
    """"const char *spec" -> "const char *"."""
    return _normalise(re.match(r"(.*?)\w+$", parameter.strip()).group(1))


def header_functions():
    """name -> (return type, [parameter types]) for every function the header declares."""
    declarations = re.findall(r"([A-Za-z_][\w\s\*]*?)\b(\w+)\(([^)]*)\);", _header_code())
    functions = {}
    for returns, name, parameters in declarations:
        parameters = " ".join(parameters.split())
        types = [] if parameters in ("", "void") else [_split_declaration(p) for p in parameters.split(",")]
        functions[name] = (_normalise(returns), types)
    return functions


def test_every_exported_function_is_declared_with_the_header_types():
    functions = header_functions()
    assert set(functions) == set(_lib._SIGNATURES)
    for name, (returns, parameters) in functions.items():
        restype, argtypes = _lib._SIGNATURES[name]
        assert restype is C_TYPES[returns], name
        assert argtypes == [C_TYPES[p] for p in parameters], name


def test_stats_fields_follow_the_header_order():
    struct = re.search(r"typedef struct StreampoolStats \{(.*?)\}", _header_code(), flags=re.S).group(1)
    fields = re.findall(r"uint64_t (\w+);", struct)
    assert tuple(fields) == _lib.STATS_FIELDS
    assert ctypes.sizeof(_lib.StreampoolStats) == 8 * len(fields)


def test_status_codes_match_the_header():
    codes = dict(re.findall(r"STREAMPOOL_STATUS_(\w+) = (-?\d+)", _header_code()))
    assert {f"STREAMPOOL_STATUS_{name}": int(code) for name, code in codes.items()} == {
        name: code for code, name in _lib.STATUS_NAMES.items()
    }


def test_timeline_structs_follow_the_header():
    for struct in (_lib.StreampoolEvent, _lib.StreampoolBlock):
        body = re.search(rf"typedef struct {struct.__name__} \{{(.*?)\}}", _header_code(), flags=re.S).group(1)
        fields = [(name, C_FIELD_TYPES[c_type]) for c_type, name in re.findall(r"(\w+) (\w+);", body)]
        assert fields == list(struct._fields_), struct.__name__


def test_event_kinds_and_block_states_match_the_header():
    kinds = dict(re.findall(r"STREAMPOOL_EVENT_KIND_(\w+) = (\d+)", _header_code()))
    assert {int(v): k.lower() for k, v in kinds.items()} == _lib.EVENT_KINDS
    states = dict(re.findall(r"STREAMPOOL_BLOCK_STATE_(\w+) = (\d+)", _header_code()))
    assert {int(v): k.lower() for k, v in states.items()} == _lib.BLOCK_STATES


def test_the_largest_size_matches_the_header():
    defined = re.search(r"#define STREAMPOOL_MAX_ALLOCATION_BYTES (\d+)", HEADER.read_text()).group(1)
    assert _lib.MAX_ALLOCATION_BYTES == int(defined)
