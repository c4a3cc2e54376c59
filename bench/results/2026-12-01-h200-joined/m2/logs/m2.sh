#!/usr/bin/env bash
# Job m2 (one H200): the benchmark's bert (memory pass with the idle memory at
# the start counted, then paired timed blocks with the A/A control), settings of
# bench/calibration.json, library .gpu/d (BUILT_FROM).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/d/libstreampool.so
R=$OUT/r; mkdir -p $R/logs; cp .gpu/m2.sh $R/logs/; cat .gpu/d/BUILT_FROM > $R/built_from.txt
nvidia-smi > $R/nvidia-smi.txt 2>&1
C=native,native-aa,expandable,streampool,streampool-pool
echo "python3 -m bench --workloads bert --configs $C --out-dir models-b" > $R/logs/command.txt
t0=$(date +%s)
timeout 540 python3 -m bench --workloads bert --configs $C --out-dir $R/models-b > $R/logs/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s)-t0 ))s" > $R/logs/times.txt
cat $R/logs/times.txt; grep -A14 "^| workload" $R/models-b/report.md | head -16
tar czf $OUT/m2.tgz -C $OUT r
