"""GPU cases for two or more devices: a pool per device and access between them."""

import numpy as np
import torch

import streampool


def _need_two_devices() -> None:
    count = torch.cuda.device_count()
    assert count >= 2, f"this case needs 2 GPUs, found {count}"


def case_two_devices(ctx) -> None:
    """Tensors on both devices from their own pools; copies both ways, contiguous (cudaMemcpyAsync)
    and strided (a copy kernel on one device reading the other's pool); a CuPy kernel on device 1
    reading device 0's pool memory when CuPy is present."""
    _need_two_devices()
    n = 1 << 22
    a = torch.arange(n, dtype=torch.float32, device="cuda:0")
    b = torch.full((n,), 3.0, device="cuda:1")
    assert streampool.memory_allocated(0) >= 4 * n and streampool.memory_allocated(1) >= 4 * n
    assert torch.equal(a.to("cuda:1").cpu(), a.cpu())
    assert torch.equal(b.to("cuda:0").cpu(), b.cpu())
    m = a.view(1024, -1)
    strided = m.t().to("cuda:1")  # not contiguous: a copy kernel, not a memcpy
    assert torch.equal(strided.cpu(), m.t().cpu())
    into = torch.empty(m.t().shape, device="cuda:0")
    into.copy_(strided)  # and back, device 1 -> device 0
    assert torch.equal(into.cpu(), m.t().cpu())
    kernel_line = "CuPy not installed"
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        twice = cupy.RawKernel(
            r"""extern "C" __global__ void twice(const float* x, float* y, int n) {
                int i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) y[i] = 2.0f * x[i];
            }""",
            "twice",
        )
        out = torch.zeros(n, device="cuda:1")
        torch.cuda.synchronize(0)
        with cupy.cuda.Device(1):
            args = (np.uint64(a.data_ptr()), np.uint64(out.data_ptr()), np.int32(n))
            twice(((n + 255) // 256,), (256,), args)
            cupy.cuda.Device(1).synchronize()
        assert torch.equal(out.cpu(), 2 * a.cpu())
        kernel_line = "a kernel on device 1 read device 0's pool memory"
    del a, b, m, strided, into
    ctx.settle()
    print(f"MULTIGPU copies both ways (memcpy and copy kernel) correct; {kernel_line}")

