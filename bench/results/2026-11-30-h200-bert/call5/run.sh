#!/usr/bin/env bash
# Call 5 (two H200s): BERT's maps on vmm in 3 rounds of its timed steps (.gpu/maps_probe.py
# plain), 078cde6's library (every due unmap in one hold of the lock) against this commit's
# (one unmap a hold, the lock handed over), twice each, alternating; and on GPU 1
# bench/diag_steps.py's own loop with this commit's call-counting build (DIAG_ROUNDS=3).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_BACKEND=vmm
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/g5.sh $R/run.sh; cp .gpu/maps_probe.py $R/
B=$PWD/.gpu/libstreampool-before.so; P=$PWD/.gpu/libstreampool-plain.so
( for L in $B $P $B $P; do CUDA_VISIBLE_DEVICES=0 STREAMPOOL_LIBRARY=$L timeout 60 taskset -c 0-15 python3 .gpu/maps_probe.py plain 2>&1 | grep -E "MAPS|Error"; done > $R/gpu0.txt ) &
( CUDA_VISIBLE_DEVICES=1 DIAG_ROUNDS=3 STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-counts.so PYTHONPATH=$PWD:$PYTHONPATH \
    timeout 90 taskset -c 28-31 python3 bench/diag_steps.py --child vmm bert > $R/calls-vmm.txt 2>&1 ) &
wait
cat $R/gpu0.txt; grep -E "^STEPS|^CALLS (my_|cuMemMap|cuMemUnmap|vmm growth)" $R/calls-vmm.txt
tar czf $OUT/g5.tgz -C $OUT r && rm -rf $R
