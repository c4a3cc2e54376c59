#!/usr/bin/env bash
# Diagnostic d1 (one H200): where multistream's memory goes under vmm's defaults.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R/traces; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/d1.sh $R/run.sh; t0=$(date +%s)
MOV="STREAMPOOL_VMM_GROWTH_SLACK=1% STREAMPOOL_VMM_COLD_AFTER=10ms"
F="timeout 120 python3 bench/diag_floor.py --child"
{ $F native multistream; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $F expandable multistream
  STREAMPOOL_BACKEND=vmm $F vmm multistream; echo "moving:"; env $MOV STREAMPOOL_BACKEND=vmm $F vmm multistream
} > $R/floor.txt 2>&1
echo "floor $(( $(date +%s)-t0 ))s" >> $R/times.txt
for w in multistream gpt2; do
  STREAMPOOL_BACKEND=vmm timeout 150 python3 -m bench.diag_vmm_trace $w --out $R/traces --rounds 1 --sync-each-step
done > $R/vmmtrace.txt 2>&1
mkdir -p $R/traces-moving
env $MOV STREAMPOOL_BACKEND=vmm timeout 100 python3 -m bench.diag_vmm_trace multistream --out $R/traces-moving --rounds 1 --sync-each-step >> $R/vmmtrace.txt 2>&1
echo "vmmtrace $(( $(date +%s)-t0 ))s" >> $R/times.txt
cat $R/times.txt; grep -E "FLOOR|Error" $R/floor.txt; grep -E "VMMTRACE|Error" $R/vmmtrace.txt | cut -c1-400
tar czf $OUT/d1.tgz -C $OUT r
