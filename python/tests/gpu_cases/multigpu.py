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



def _reader_kernel():
    """A CuPy kernel that sums ``n`` floats read from any device's memory into one float, or None
    without CuPy."""
    try:
        import cupy
    except ImportError:
        return None, None
    kernel = cupy.RawKernel(
        r"""extern "C" __global__ void copy(const float* x, float* y, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) y[i] = x[i];
        }""",
        "copy",
    )
    return cupy, kernel


def case_peer_reads_while_pages_move(ctx) -> None:
    """Memory of device 1 allocated after peer access was enabled (the vmm backend maps it then)
    is read by kernels on device 0, copy after copy, while device 1's allocator churns through
    other sizes (idle pages move on the vmm backend): every value read is right."""
    _need_two_devices()
    streampool.enable_peer_access("all")
    n = 8 << 20  # 32 MiB of float32 each
    sources = [torch.full((n,), float(i + 1), device="cuda:1") for i in range(4)]
    cupy, kernel = _reader_kernel()
    torch.cuda.synchronize(1)
    rng = np.random.default_rng(0)
    checked = 0
    for round_ in range(12):
        outs = [torch.empty(n, device="cuda:0") for _ in sources]
        for src, out in zip(sources, outs):
            if kernel is not None:
                with cupy.cuda.Device(0):
                    args = (np.uint64(src.data_ptr()), np.uint64(out.data_ptr()), np.int32(n))
                    kernel(((n + 255) // 256,), (256,), args)
            else:
                out.copy_(src, non_blocking=True)
        # Device 1 allocates and frees other sizes meanwhile (no synchronisation with device 0).
        with torch.cuda.device(1):
            churn = [torch.empty(int(s), dtype=torch.uint8, device="cuda:1") for s in rng.integers(1 << 20, 96 << 20, 16)]
            del churn
        torch.cuda.synchronize(0)
        for i, out in enumerate(outs):
            assert torch.all(out == float(i + 1)).item(), f"round {round_}: device 0 read wrong data from device 1"
            checked += 1
    reader = "a CuPy kernel on device 0" if kernel is not None else "copies on device 0's stream"
    del sources, outs
    ctx.settle()
    print(f"MULTIGPU {checked} reads of device 1's memory by {reader} while device 1 churned: all correct")


def case_set_device_in_one_thread(ctx) -> None:
    """One thread switching ``torch.cuda.set_device`` back and forth: each tensor lands on the
    current device, is counted there, and computes correctly."""
    _need_two_devices()
    before = [streampool.memory_allocated(d) for d in (0, 1)]
    kept = []
    for step in range(20):
        device = step % 2
        torch.cuda.set_device(device)
        t = torch.full((1 << 18,), float(step), device="cuda")
        assert t.device.index == device, (step, t.device)
        kept.append(t)
    for d in (0, 1):
        grown = streampool.memory_allocated(d) - before[d]
        assert grown == 10 * (1 << 18) * 4, f"device {d}: {grown} B allocated, expected 10 tensors"
    total = sum(t.sum().item() for t in kept)
    assert total == sum(float(s) * (1 << 18) for s in range(20))
    torch.cuda.set_device(0)
    del kept
    ctx.settle()
    print("MULTIGPU set_device switching in one thread: tensors on the current device, counted there")


def case_idle_release_per_device(ctx) -> None:
    """Each device goes idle on its own: device 1, unused, gives its memory back after
    STREAMPOOL_IDLE_RELEASE (2 s) while device 0, kept busy, keeps its memory."""
    import time

    _need_two_devices()
    for d in (0, 1):
        with torch.cuda.device(d):
            x = torch.empty(256 << 20, dtype=torch.uint8, device=f"cuda:{d}")
            del x
    held = [streampool.memory_reserved(d) for d in (0, 1)]
    assert min(held) >= 256 << 20, held
    deadline = time.time() + 8.0
    while time.time() < deadline and streampool.memory_reserved(1) >= 256 << 20:
        y = torch.empty(256 << 20, dtype=torch.uint8, device="cuda:0")  # device 0 stays busy
        del y
        time.sleep(0.2)
    busy, idle = streampool.memory_reserved(0), streampool.memory_reserved(1)
    assert idle < 256 << 20, f"device 1 kept {idle} B after {8.0} s idle"
    assert busy >= 256 << 20, f"device 0 gave its memory back while busy ({busy} B)"
    print(f"MULTIGPU idle device 1 released its memory (now {idle} B) while busy device 0 kept {busy} B")
