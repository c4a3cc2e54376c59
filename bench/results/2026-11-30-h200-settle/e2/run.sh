#!/usr/bin/env bash
# Experiment e2 (two H200s), library c888a14: is BERT's time under a growth slack the handles'
# size (one page a handle) or page moves?
# GPU 0: bert, the defaults against one page a handle with nothing else changed (variant pages).
# GPU 1: bert's steps under vmm with the timeline recording, defaults and a 5% slack: the pages
#   mapped and unmapped in its timed steps (bench/diag_vmm_trace.py, 3 rounds, no synchronisation).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/e2.sh $R/run.sh; t0=$(date +%s)
( CUDA_VISIBLE_DEVICES=0 timeout 250 taskset -c 0-15 python3 -m bench --workloads bert \
    --configs native,native-aa,streampool-vmm --variant pages:STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_SPAN_SIZE=0 \
    --processes 3 --budget-s 240 --out-dir $R/bert > $R/bert.log 2>&1
  echo "bert rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( for v in "" "STREAMPOOL_VMM_GROWTH_SLACK=5%"; do
    mkdir -p $R/traces${v:+-slack5}
    env $v STREAMPOOL_BACKEND=vmm CUDA_VISIBLE_DEVICES=1 timeout 120 taskset -c 16-31 python3 -m bench.diag_vmm_trace bert \
      --out $R/traces${v:+-slack5} --rounds 3
  done > $R/vmmtrace.txt 2>&1
  echo "vmmtrace rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
grep -A5 "^| workload | native | native-aa" $R/bert/report.md | head -4; grep -A9 "^## Peak device memory" $R/bert/report.md | grep '^| `'
grep -E "VMMTRACE|Error" $R/vmmtrace.txt | sed 's/ path=.*//'
tar czf $OUT/e2.tgz -C $OUT r
