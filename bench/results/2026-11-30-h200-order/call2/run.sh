#!/usr/bin/env bash
# Diagnostic call (two H200s). GPU 0, CPUs 0-15: where BERT's memory after churn comes from:
# churn then bert with spans off (STREAMPOOL_VMM_SPAN_SIZE=0: no span, no memory ahead), and
# bert alone. GPU 1, CPUs 16-31: memcheck on vmm.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; t0=$(date +%s)
( export CUDA_VISIBLE_DEVICES=0
  timeout 300 taskset -c 0-15 python3 -m bench --workloads churn,bert \
    --configs native,streampool-vmm --variant nospan:STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_SPAN_SIZE=0 \
    --processes 2 --pairs 2 --budget-s 280 --out-dir $R/order > $R/order.log 2>&1
  echo "order rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
  timeout 200 taskset -c 0-15 python3 -m bench --workloads bert --configs native,streampool-vmm \
    --processes 2 --pairs 2 --budget-s 180 --out-dir $R/alone > $R/alone.log 2>&1
  echo "alone rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 STREAMPOOL_BACKEND=vmm timeout 300 taskset -c 16-31 \
    scripts/gpu-check --log-dir $R/memcheck memcheck > $R/memcheck.txt 2>&1
  echo "memcheck rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
echo "== memcheck"; sed -n '/SUMMARY/,$p' $R/memcheck.txt | head -n 12; grep -h "ERROR SUMMARY" $R/memcheck/* 2>/dev/null | sort | uniq -c
echo "== order"; grep -E "memory pass" $R/order.log
echo "== alone"; grep -E "memory pass" $R/alone.log
tar czf $OUT/f4.tgz -C $OUT r && rm -rf $R
