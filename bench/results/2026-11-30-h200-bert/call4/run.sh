#!/usr/bin/env bash
# Call 4 (two H200s): pages BERT maps on vmm in 3 rounds of its timed steps, under loop variants
# (.gpu/maps_probe.py), one process each. GPU 0: plain, history, sentinel (plain build);
# GPU 1: roundstats and plain (plain build), plain (call-counting build).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_BACKEND=vmm
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/g4.sh $R/run.sh; cp .gpu/maps_probe.py $R/
P=$PWD/.gpu/libstreampool-plain.so; C=$PWD/.gpu/libstreampool-counts.so
( for m in plain history sentinel; do CUDA_VISIBLE_DEVICES=0 STREAMPOOL_LIBRARY=$P timeout 60 taskset -c 0-15 python3 .gpu/maps_probe.py $m 2>&1 | grep -E "MAPS|Error"; done > $R/gpu0.txt ) &
( for m in roundstats plain; do CUDA_VISIBLE_DEVICES=1 STREAMPOOL_LIBRARY=$P timeout 60 taskset -c 16-31 python3 .gpu/maps_probe.py $m 2>&1 | grep -E "MAPS|Error"; done > $R/gpu1.txt
  CUDA_VISIBLE_DEVICES=1 STREAMPOOL_LIBRARY=$C timeout 60 taskset -c 16-31 python3 .gpu/maps_probe.py plain 2>&1 | grep -E "MAPS|Error" >> $R/gpu1.txt ) &
wait
cat $R/gpu0.txt $R/gpu1.txt
tar czf $OUT/g4.tgz -C $OUT r && rm -rf $R
