"""Run by every Python process of a ``streampool compare`` run (this folder is first on the run's
PYTHONPATH, and Python imports ``sitecustomize`` at start-up): DataLoader workers started with
spawn or forkserver, ``torchrun``'s workers and any other Python child inherit it with the
environment, so each gets the run's allocator without a change to the user's script.

What it does, only where ``_STREAMPOOL_COMPARE_ALLOCATOR`` is set:
- when the process imports ``torch`` (and only then: a process that never does is left alone),
  right after torch's own import and so before any CUDA work: ``streampool.install()`` if
  ``_STREAMPOOL_COMPARE_INSTALL=1`` (the STREAMPOOL_* variables of the run say how); a failure
  fails that ``import torch`` with the reason;
- at exit, in a process that initialised CUDA: its out-of-memory count and peak tensor bytes per
  device (``torch.cuda.memory_stats``) and whether streampool served it, into
  ``$_STREAMPOOL_COMPARE_OUT/stats-<pid>.json``;
- with ``_STREAMPOOL_COMPARE_SAMPLE_MS`` (no NVML on the machine): a thread that samples
  ``torch.cuda.mem_get_info`` of every device the process has a context on into
  ``samples-<pid>.txt``.
Then it runs the ``sitecustomize`` it shadows, if there is one.
"""

import os
import sys

ALLOCATOR_ENV = "_STREAMPOOL_COMPARE_ALLOCATOR"
INSTALL_ENV = "_STREAMPOOL_COMPARE_INSTALL"
OUT_ENV = "_STREAMPOOL_COMPARE_OUT"
PACKAGE_ENV = "_STREAMPOOL_COMPARE_PACKAGE"
SAMPLE_ENV = "_STREAMPOOL_COMPARE_SAMPLE_MS"
HERE = os.path.dirname(os.path.realpath(__file__))


def _load_streampool():
    """The streampool package compare runs from (``$_STREAMPOOL_COMPARE_PACKAGE``), without
    putting its site-packages on this process's path; an already imported one is kept."""
    module = sys.modules.get("streampool")
    if module is not None:
        return module
    import importlib.util

    package = os.environ[PACKAGE_ENV]
    spec = importlib.util.spec_from_file_location(
        "streampool", os.path.join(package, "__init__.py"), submodule_search_locations=[package]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["streampool"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["streampool"]
        raise
    return module


def _write_stats(torch, out):
    """At exit: this process's allocator figures, if it used CUDA (never raises)."""
    record = {"pid": os.getpid(), "allocator": os.environ.get(ALLOCATOR_ENV)}
    try:
        if not torch.cuda.is_initialized():
            return
        record["cuda_used"] = True
        streampool = sys.modules.get("streampool")
        record["streampool_installed"] = bool(streampool is not None and streampool.is_installed())
        devices = {}
        for index in range(torch.cuda.device_count()):
            stats = torch.cuda.memory_stats(index)
            devices[str(index)] = {
                "num_ooms": stats.get("num_ooms"),
                "peak_allocated_bytes": stats.get("allocated_bytes.all.peak"),
            }
        record["devices"] = devices
    except Exception as exc:  # the user's exit status must not change
        record["error"] = f"{type(exc).__name__}: {exc}"
    try:
        import json

        path = os.path.join(out, f"stats-{os.getpid()}.json")
        with open(path + ".tmp", "w") as handle:
            json.dump(record, handle)
        os.replace(path + ".tmp", path)
    except Exception:
        pass


def _active_devices(torch):
    """Devices this process has a CUDA context on (the driver's primary-context state, so asking
    creates none); every device if the driver cannot be asked."""
    count = torch.cuda.device_count()
    try:
        import ctypes

        cuda = ctypes.CDLL("libcuda.so.1")
        active = []
        for index in range(count):
            device, flags, on = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
            if cuda.cuDeviceGet(ctypes.byref(device), index) != 0:
                continue
            if cuda.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(on)) == 0 and on.value:
                active.append(index)
        return active
    except OSError:
        return list(range(count))


def _sample(torch, out, interval_s):
    """Thread body: device memory in use, every ``interval_s``, once CUDA is initialised."""
    import time

    path = os.path.join(out, f"samples-{os.getpid()}.txt")
    with open(path, "a", buffering=1) as handle:
        while True:
            time.sleep(interval_s)
            try:
                if not torch.cuda.is_initialized():
                    continue
                now = time.time()
                for index in _active_devices(torch):
                    free, total = torch.cuda.mem_get_info(index)
                    handle.write(f"{now:.3f} {index} {total - free}\n")
            except Exception:
                return  # the interpreter is shutting down, or CUDA is gone


def _after_torch_import(torch):
    out = os.environ.get(OUT_ENV)
    if out:
        import atexit

        atexit.register(_write_stats, torch, out)
    if os.environ.get(INSTALL_ENV) == "1":
        try:
            _load_streampool().install()
        except Exception as exc:
            raise ImportError(
                f"streampool compare: streampool.install() failed in process {os.getpid()}: {exc}"
            ) from exc
    sample_ms = os.environ.get(SAMPLE_ENV)
    if out and sample_ms:
        import threading

        thread = threading.Thread(
            target=_sample, args=(torch, out, float(sample_ms) / 1000.0), name="streampool-compare-sampler", daemon=True
        )
        thread.start()


class _TorchImportHook:
    """A meta path finder that answers only for ``torch`` until torch has been imported: it finds
    torch's spec with the other finders and has :func:`_after_torch_import` run right after
    torch's module has executed. Every spec asked for is wrapped, since a lookup need not be an
    import (``importlib.util.find_spec("torch")``, as libraries do to see whether torch is there)."""

    def __init__(self):
        self.done = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" or self.done:
            return None
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module
        hook = self

        def exec_module(module):
            original(module)
            if not hook.done:  # stays in sys.meta_path: removing it during an import skips a finder
                hook.done = True
                _after_torch_import(module)

        spec.loader.exec_module = exec_module
        return spec


def _run_shadowed_sitecustomize():
    """Import the sitecustomize this file hides (a distribution's or a virtual environment's)."""
    import importlib

    here = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != HERE]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        if here is not None:
            sys.modules["sitecustomize"] = here


if os.environ.get(ALLOCATOR_ENV) and "torch" not in sys.modules:
    sys.meta_path.insert(0, _TorchImportHook())
_run_shadowed_sitecustomize()
