#!/usr/bin/env bash
# Call g2 (one H200), the library of 5afd1d7 (at a synchronisation each stream is asked once
# whether it has finished, not once a block).
# First: multistream and churn: native, native-aa, expandable segments, vmm, and vmm under
#   1ff4597's library (variant prev: a query a block).
# Then: what single driver calls and torch.cuda.synchronize() cost (native; and under install()
#   on vmm, the hook with nothing to do), then how compiled's, churn's and vision_sizes' peaks
#   divide (bench/diag_floor.py: memory outside any allocator).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/g2.sh $R/run.sh; t0=$(date +%s)
timeout 190 python3 -m bench --workloads multistream,churn \
    --configs native,native-aa,expandable,streampool-vmm \
    --variant prev:STREAMPOOL_BACKEND=vmm,STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-prev.so \
    --pairs 6 --processes 3 --budget-s 180 --out-dir $R/streams > $R/streams.log 2>&1
echo "streams rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
cat > $R/calls.py <<'PY'
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
PY
for c in native vmm native vmm; do STREAMPOOL_BACKEND=vmm timeout 60 taskset -c 0-2 python3 $R/calls.py $c; done > $R/calls.txt 2>&1
timeout 200 python3 bench/diag_floor.py compiled churn vision_sizes > $R/floor.txt 2>&1
echo "floor rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
cat $R/times.txt; grep CALL $R/calls.txt; grep -E "FLOOR|Error" $R/floor.txt
grep -A6 "^| workload | native | native-aa" $R/streams/report.md | head -5
grep -A9 "^## Peak device memory" $R/streams/report.md | grep '^| `'
tar czf $OUT/g2.tgz -C $OUT r
