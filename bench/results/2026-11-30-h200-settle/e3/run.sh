#!/usr/bin/env bash
# Experiment e3 (one H200), library c888a14: the benchmark's sequence in one worker (memory pass,
# empty_cache(), blocks of 7 timed steps 0.15 s apart), streampool's driver counters a block:
# BERT under the defaults and under a 5% growth slack, churn under the slack.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/e3.sh $R/run.sh; t0=$(date +%s)
export STREAMPOOL_BACKEND=vmm
SEQUENCE_WORKLOADS=bert scripts/gpu-diag --log-dir $R/default sequence > /dev/null 2>&1
STREAMPOOL_VMM_GROWTH_SLACK=5% SEQUENCE_WORKLOADS="bert churn" scripts/gpu-diag --log-dir $R/slack5 sequence > /dev/null 2>&1
echo "done $(( $(date +%s)-t0 ))s"
for d in default slack5; do echo "== $d"; grep -E "SEQUENCE|Error" $R/$d/sequence.txt | sed 's/num_//g'; done
tar czf $OUT/e3.tgz -C $OUT r
