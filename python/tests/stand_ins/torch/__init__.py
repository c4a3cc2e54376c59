"""A stand-in for PyTorch in CPU tests (put its parent folder on PYTHONPATH of a subprocess).

It offers just what streampool.install(), streampool compare's bootstrap and PyTorch's memory
functions touch, and behaves as PyTorch 2.11 does there: ``torch.cuda.memory`` copies the logic of
PyTorch's own memory functions over ``torch._C``, whose statistics call raises once a pluggable
allocator is current, as PyTorch's does. Environment: ``FAKE_TORCH_GPU=1`` makes
``torch.cuda.is_available()`` true; ``torch.cuda.init()`` or ``FAKE_TORCH_CUDA_INITIALISED=1`` makes CUDA look initialised;
``FAKE_TORCH_STATS`` (JSON) is what the native allocator's statistics call returns;
``torch.cuda.mem_get_info`` reports ``FAKE_TORCH_USED_BYTES`` of 16 GiB in use.
"""

from . import _C, cuda, multiprocessing, nn  # noqa: F401

__version__ = "0.0.0+stand-in"


class Tensor:
    pass


nn.Parameter = type("Parameter", (Tensor,), {})
multiprocessing.register(Tensor, nn.Parameter)
