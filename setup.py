"""What pyproject.toml cannot say: the library's file name and a wheel tag free of any CPython ABI.

libstreampool.so is loaded with ctypes (by streampool and by PyTorch's CUDAPluggableAllocator), so
it needs no ``.cpython-311-x86_64-linux-gnu`` suffix and the wheel works on every Python 3.
"""

import os

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools_rust import build_rust

LIBRARY_NAME = "libstreampool.so"


class BuildRustPlainName(build_rust):
    """Installs the cdylib as streampool/libstreampool.so instead of an extension-module name."""

    def get_dylib_ext_path(self, ext, target_fname):
        extension_path = super().get_dylib_ext_path(ext, target_fname)
        return os.path.join(os.path.dirname(extension_path), LIBRARY_NAME)


class BdistWheelAnyPython(bdist_wheel):
    """Tags the wheel py3-none-<platform>: platform-specific, Python-version-independent."""

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(cmdclass={"build_rust": BuildRustPlainName, "bdist_wheel": BdistWheelAnyPython})
