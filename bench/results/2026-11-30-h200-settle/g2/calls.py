"""Nanoseconds a call, from Python through ctypes (the first line: the ctypes floor)."""
import ctypes, sys, time
import torch
if sys.argv[1] == "vmm":
    import streampool
    streampool.install()
cuda = ctypes.CDLL("libcuda.so.1")
x = torch.ones(1, device="cuda")
s1 = torch.cuda.Stream()
e = torch.cuda.Event()
e.record(s1)
torch.cuda.synchronize()
ev, st, ctx, capt = ctypes.c_void_p(e.cuda_event), ctypes.c_void_p(s1.cuda_stream), ctypes.c_void_p(), ctypes.c_int()
def t(name, f, n=100000):
    for _ in range(1000):
        f()
    a = time.perf_counter_ns()
    for _ in range(n):
        f()
    print(f"CALL {sys.argv[1]} {name}: {(time.perf_counter_ns() - a) / n:.0f} ns", flush=True)
t("cuCtxGetCurrent (ctypes floor)", lambda: cuda.cuCtxGetCurrent(ctypes.byref(ctx)))
t("cuStreamQuery, idle stream", lambda: cuda.cuStreamQuery(st))
t("cuEventQuery, completed", lambda: cuda.cuEventQuery(ev))
t("cuStreamIsCapturing", lambda: cuda.cuStreamIsCapturing(st, ctypes.byref(capt)))
t("cuEventRecord, idle stream", lambda: cuda.cuEventRecord(ev, st))
torch.cuda.synchronize()
t("torch.cuda.synchronize(), idle device", torch.cuda.synchronize, n=50000)
