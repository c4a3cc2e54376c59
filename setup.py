"""What pyproject.toml cannot say: the library's file name, a wheel tag free of any CPython ABI,
and the release wheel's prebuilt library.

libstreampool.so is loaded with ctypes (by streampool and by PyTorch's CUDAPluggableAllocator), so
it needs no ``.cpython-311-x86_64-linux-gnu`` suffix and the wheel works on every Python 3.

``pip install .`` builds the library with cargo. scripts/build-wheel builds it for an old glibc
first (cargo-zigbuild) and sets ``STREAMPOOL_PREBUILT_LIBRARY`` to that file, which is then packaged
as it is instead of running cargo again.
"""

import os

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools_rust import build_rust

LIBRARY_NAME = "libstreampool.so"
PREBUILT_ENV = "STREAMPOOL_PREBUILT_LIBRARY"


class BuildRustPlainName(build_rust):
    """Installs the cdylib as streampool/libstreampool.so instead of an extension-module name,
    taking it from ``$STREAMPOOL_PREBUILT_LIBRARY`` when that is set."""

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
