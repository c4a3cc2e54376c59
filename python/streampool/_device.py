"""Turning the ``device`` arguments PyTorch users write into a device index, without importing torch."""

import sys
from typing import Any

from ._lib import InvalidArgumentError


def current_device() -> int:
    """PyTorch's current CUDA device if torch is imported and CUDA initialised, else 0."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return 0


# The library takes a device as a C int: a larger one would reach it wrapped (2**32 as device 0).
_C_INT_MIN, _C_INT_MAX = -(2**31), 2**31 - 1


def device_index(device: Any = None) -> int:
    """Index for ``device``: None (current device), an int, "cuda", "cuda:N" or a torch.device.
    Range checks are left to the library, which knows how many devices there are, for every
    index a C int holds; a larger one is refused here (InvalidArgumentError naming it)."""
    if device is None:
        return current_device()
    if isinstance(device, bool):
        raise TypeError("device must be an int, a string like 'cuda:0' or a torch.device, not bool")
    if isinstance(device, int):
        return _in_c_int(device, repr(device))
    if isinstance(device, str):
        return _parse_device_string(device)
    if type(device).__name__ == "device" and hasattr(device, "type") and hasattr(device, "index"):
        return _cuda_index(device.type, device.index, repr(device))
    raise TypeError(
        f"device must be an int, a string like 'cuda:0' or a torch.device, not {type(device).__name__}"
    )


def _parse_device_string(text: str) -> int:
    kind, _, index = text.strip().partition(":")
    if index and not index.isdigit():
        raise ValueError(f"invalid device string {text!r}: expected 'cuda' or 'cuda:N'")
    return _cuda_index(kind, int(index) if index else None, repr(text))


def _cuda_index(kind: str, index: Any, shown: str) -> int:
    if kind != "cuda":
        raise ValueError(f"streampool manages CUDA memory; device {shown} is not a CUDA device")
    return current_device() if index is None else _in_c_int(index, shown)


def _in_c_int(index: int, shown: str) -> int:
    if not _C_INT_MIN <= index <= _C_INT_MAX:
        raise InvalidArgumentError(
            f"device {shown} does not exist: a device is an index from 0 to the number of devices less one"
        )
    return index
