#!/usr/bin/env bash
# Call j1 (one H200) of the full run of the library of BUILT_FROM (vmm the default): the groups
# alloc, compiled and sleep, each alone on the GPU, with the settings of bench/calibration.json.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R/logs; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/j1.sh $R/logs/j1.sh
nvidia-smi > $R/nvidia-smi.txt 2>&1; lscpu > $R/lscpu.txt 2>&1; nvidia-smi topo -m > $R/topo.txt 2>&1
C=native,native-aa,expandable,streampool,streampool-pool
t0=$(date +%s); T=$R/logs/j1-times.txt
timeout 250 python3 -m bench --group alloc --configs $C --out-dir $R/alloc > $R/logs/alloc.log 2>&1
echo "alloc rc=$? $(( $(date +%s)-t0 ))s" >> $T
timeout 165 python3 -m bench --group compiled --configs $C --out-dir $R/compiled > $R/logs/compiled.log 2>&1
echo "compiled rc=$? $(( $(date +%s)-t0 ))s" >> $T
python3 -m pip install -q --no-index --no-deps --target .tms .whl/torch_memory_saver-0.0.10-*.whl > $R/tms-install.txt 2>&1
PYTHONPATH=$PWD/python:$PWD/.tms timeout 130 python3 -m bench --group sleep --out-dir $R/sleep > $R/logs/sleep.log 2>&1
echo "sleep rc=$? $(( $(date +%s)-t0 ))s" >> $T
cat $T; tail -4 $R/logs/alloc.log $R/logs/compiled.log; grep "streampool-vmm\|tms" $R/logs/sleep.log | cut -c1-200
tar czf $OUT/j1.tgz -C $OUT r
