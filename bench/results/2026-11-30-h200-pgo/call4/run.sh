#!/usr/bin/env bash
# Call 4 (two H200s): BERT's time on vmm with the default growth slack (1%) against a slack that
# leaves its steps without page moves in the replay (10%) and one with fewer (2%), each against
# native in the same run, with native's A/A. GPU 0, CPUs 0-15: 10%; GPU 1, CPUs 16-31: 2%.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/g4.sh $R/run.sh; t0=$(date +%s)
( CUDA_VISIBLE_DEVICES=0 timeout 310 taskset -c 0-15 python3 -m bench --workloads bert \
  --configs native,native-aa,streampool-vmm --variant slack10:STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_GROWTH_SLACK=10% \
  --processes 4 --budget-s 280 --out-dir $R/slack10 > $R/slack10.log 2>&1
  echo "slack10 rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 310 taskset -c 16-31 python3 -m bench --workloads bert \
  --configs native,native-aa,streampool-vmm --variant slack2:STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_GROWTH_SLACK=2% \
  --processes 4 --budget-s 280 --out-dir $R/slack2 > $R/slack2.log 2>&1
  echo "slack2 rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
for g in slack10 slack2; do echo "== $g"; grep -A6 "^| workload | native | native-aa" $R/$g/report.md | head -5; grep -A4 "^## Peak device memory" $R/$g/report.md | tail -1; done
tar czf $OUT/g4.tgz -C $OUT r && rm -rf $R
