#!/usr/bin/env bash
# Call f1 (two H200s), library 340a3bd (memory ahead only in a threshold's or a sleep's cycle; at
# the program's synchronisation what was freed is ready for every stream), built with its profile.
# GPU 0: bert, gpt2. GPU 1: vision_sizes, churn, multistream (one process, in that order), then
# multistream's memory pass alone (bench/diag_floor.py) under native, expandable and vmm.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/f1.sh $R/run.sh; t0=$(date +%s)
nvidia-smi > $R/nvidia-smi.txt 2>&1
C=native,native-aa,expandable,streampool-vmm
( CUDA_VISIBLE_DEVICES=0 timeout 330 taskset -c 0-15 python3 -m bench --workloads bert,gpt2 \
    --configs $C --processes 3 --budget-s 320 --out-dir $R/models > $R/models.log 2>&1
  echo "models rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 290 taskset -c 16-31 python3 -m bench --workloads \
    vision_sizes,churn,multistream --configs $C --pairs 8 --processes 3 --budget-s 280 \
    --out-dir $R/vision > $R/vision.log 2>&1
  echo "vision rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
  F="timeout 60 taskset -c 16-31 python3 bench/diag_floor.py --child"
  { CUDA_VISIBLE_DEVICES=1 $F native multistream
    CUDA_VISIBLE_DEVICES=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $F expandable multistream
    CUDA_VISIBLE_DEVICES=1 STREAMPOOL_BACKEND=vmm $F vmm multistream; } > $R/floor.txt 2>&1
  echo "floor rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
for n in models vision; do grep -A8 "^| workload | native | native-aa" $R/$n/report.md | head -7; grep -A9 "^## Peak device memory" $R/$n/report.md | grep '^| `'; done
grep FLOOR $R/floor.txt
tar czf $OUT/f1.tgz -C $OUT r
