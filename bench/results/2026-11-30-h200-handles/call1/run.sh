#!/usr/bin/env bash
# Call 1 (two H200s): does the handle size change kernels' time (diag_translation), and BERT on
# vmm with one handle a page (default), 256 MiB handles, and a 3% growth slack with pages cold
# after 1 s (no page moved in the replay's timed steps), each paired with native.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/c1.sh $R/run.sh
nvidia-smi > $R/nvidia-smi.txt 2>&1
SPAN=STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_SPAN_SIZE=256MiB
S3=STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_GROWTH_SLACK=3%,STREAMPOOL_VMM_COLD_AFTER=1s
(
  export CUDA_VISIBLE_DEVICES=0
  DIAG_CONFIGS=native,expandable,pool,vmm,vmmspan DIAG_VARIANTS="vmmspan:$SPAN" \
    timeout 150 taskset -c 0-15 python3 bench/diag_translation.py > $R/translation.txt 2>&1
  echo "translation rc=$?" >> $R/translation.txt
  timeout 230 taskset -c 0-15 python3 -m bench --workloads bert --configs native,native-aa,streampool-vmm \
    --variant span:$SPAN --processes 3 --budget-s 200 --out-dir $R/gpu0 > $R/gpu0.log 2>&1
  echo "gpu0 rc=$?" >> $R/gpu0.log
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 230 taskset -c 16-31 python3 -m bench --workloads bert --configs native,native-aa,streampool-vmm \
    --variant s3:$S3 --processes 3 --budget-s 200 --out-dir $R/gpu1 > $R/gpu1.log 2>&1
  echo "gpu1 rc=$?" >> $R/gpu1.log
) &
wait
cat $R/translation.txt; tail -2 $R/gpu0.log $R/gpu1.log
for d in gpu0 gpu1; do grep -A4 "^| workload | native | native-aa" $R/$d/report.md | head -3; done
tar czf $OUT/g1.tgz -C $OUT r
