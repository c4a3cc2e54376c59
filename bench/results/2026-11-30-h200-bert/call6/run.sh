#!/usr/bin/env bash
# Call 6 (one H200): traces made under vmm of BERT and vision_sizes (3 rounds of their timed
# steps) with the libraries left cold (cuBLAS's and cuDNN's handles made by the workload's first
# step), then BERT with them warmed up first, as the benchmark does.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-plain.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/g6.sh $R/run.sh
VMMTRACE_WORKLOADS="bert vision_sizes" VMMTRACE_ROUNDS=3 VMMTRACE_ARGS=--no-library-warm-up timeout 200 \
  scripts/gpu-diag --log-dir $R/cold vmmtrace > $R/cold.log 2>&1
VMMTRACE_WORKLOADS=bert VMMTRACE_ROUNDS=3 timeout 100 scripts/gpu-diag --log-dir $R/warm vmmtrace > $R/warm.log 2>&1
cat $R/cold.log $R/warm.log
tar czf $OUT/g6.tgz -C $OUT r && rm -rf $R
