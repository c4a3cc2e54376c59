"""What pyproject.toml cannot say: the library's file name, a wheel tag free of any CPython ABI,
the release wheel's prebuilt library, and a one-line error naming the Rust a build needs.

libstreampool.so is loaded with ctypes (by streampool and by PyTorch's CUDAPluggableAllocator), so
it needs no ``.cpython-311-x86_64-linux-gnu`` suffix and the wheel works on every Python 3.

``pip install .`` builds the library with cargo, which must be Cargo.toml's ``rust-version`` or
newer; without it the build stops at once saying which version and how to get it. scripts/build-wheel
builds the library for an old glibc first (cargo-zigbuild) and sets ``STREAMPOOL_PREBUILT_LIBRARY``
to that file, which is then packaged as it is instead of running cargo again.
"""

import os
import re
import shutil
import subprocess
from typing import Callable, Optional, Tuple

LIBRARY_NAME = "libstreampool.so"
PREBUILT_ENV = "STREAMPOOL_PREBUILT_LIBRARY"
HERE = os.path.dirname(os.path.abspath(__file__))
RUSTUP = "curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh (https://rustup.rs), then a new shell"


def rust_version_needed(cargo_toml: str = os.path.join(HERE, "Cargo.toml")) -> str:
    """The ``rust-version`` of Cargo.toml's [package]: the oldest Rust that builds the library."""
    with open(cargo_toml, encoding="utf-8") as f:
        match = re.search(r'^rust-version\s*=\s*"([0-9.]+)"', f.read(), flags=re.M)
    if match is None:
        raise RuntimeError(f"{cargo_toml} declares no rust-version")
    return match.group(1)


def _version(text: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def rust_problem(needed: str, which: Callable[[str], Optional[str]] = shutil.which,
                 run: Callable[..., "subprocess.CompletedProcess[str]"] = subprocess.run) -> Optional[str]:
    """Why this machine cannot build the library, in one line naming the fix; None if it can."""
    missing = [tool for tool in ("cargo", "rustc") if which(tool) is None]
    if missing:
        return (f"building streampool needs Rust {needed} or newer with cargo, and {' and '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not on PATH: install Rust with {RUSTUP}")
    done = run(["rustc", "--version"], capture_output=True, text=True)
    found = re.match(r"rustc (\d+\.\d+(\.\d+)?)", done.stdout or "")
    if done.returncode != 0 or found is None:
        return (f"building streampool needs Rust {needed} or newer, and `rustc --version` failed "
                f"({(done.stderr or done.stdout).strip() or 'no output'}): install Rust with {RUSTUP}")
    if _version(found.group(1))[:2] < _version(needed)[:2]:
        return (f"building streampool needs Rust {needed} or newer, and this rustc ({which('rustc')}) is "
                f"{found.group(1)}: run `rustup update`, or install rustup with {RUSTUP} "
                "(a distribution's rustc package is often older)")
    return None


def main() -> None:
    from setuptools import setup
    from setuptools.command.bdist_wheel import bdist_wheel
    from setuptools.errors import PlatformError
    from setuptools_rust import build_rust

    class BuildRustPlainName(build_rust):
        """Installs the cdylib as streampool/libstreampool.so instead of an extension-module name,
        taking it from ``$STREAMPOOL_PREBUILT_LIBRARY`` when that is set."""

        def run(self):
            if not os.environ.get(PREBUILT_ENV):
                problem = rust_problem(rust_version_needed())
                if problem:
                    raise PlatformError(problem)
            super().run()

        def get_dylib_ext_path(self, ext, target_fname):
            extension_path = super().get_dylib_ext_path(ext, target_fname)
            return os.path.join(os.path.dirname(extension_path), LIBRARY_NAME)

        def build_extension(self, ext, *args, **kwargs):
            prebuilt = os.environ.get(PREBUILT_ENV)
            if not prebuilt:
                return super().build_extension(ext, *args, **kwargs)
            if not os.path.isfile(prebuilt):
                raise FileNotFoundError(f"{PREBUILT_ENV}={prebuilt} does not name a file")
            from setuptools_rust.build import _BuiltModule

            return [_BuiltModule(ext.name, os.path.abspath(prebuilt))], None

    class BdistWheelAnyPython(bdist_wheel):
        """Tags the wheel py3-none-<platform>: platform-specific, Python-version-independent."""

        def get_tag(self):
            _, _, platform = super().get_tag()
            return "py3", "none", platform

    setup(cmdclass={"build_rust": BuildRustPlainName, "bdist_wheel": BdistWheelAnyPython})


if __name__ == "__main__":  # setuptools runs this file as __main__ (pip install ., setup.py)
    main()
