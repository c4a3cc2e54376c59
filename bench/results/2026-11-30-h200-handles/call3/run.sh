#!/usr/bin/env bash
# Call 3 (two H200s): the final commit's library, built with its profile (scripts/build-pgo, as
# the release wheel's), its defaults (no page moved while the device has room, new memory in
# 8 MiB spans) against the moving ones (variant "moving": STREAMPOOL_VMM_GROWTH_SLACK=1%,
# STREAMPOOL_VMM_COLD_AFTER=10ms, one page a handle), native, native-aa and expandable segments.
# GPU 0: bert, gpt2. GPU 1: vision_sizes, churn, multistream, then the sleep group (against
# torch_memory_saver 0.0.10, installed from .whl as its users do).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/c3.sh $R/run.sh; t0=$(date +%s)
nvidia-smi > $R/nvidia-smi.txt 2>&1
M=moving:STREAMPOOL_BACKEND=vmm,STREAMPOOL_VMM_GROWTH_SLACK=1%,STREAMPOOL_VMM_COLD_AFTER=10ms
C=native,native-aa,expandable,streampool-vmm
( CUDA_VISIBLE_DEVICES=0 timeout 420 taskset -c 0-15 python3 -m bench --workloads bert,gpt2 \
    --configs $C --variant $M --processes 3 --budget-s 400 --out-dir $R/models > $R/models.log 2>&1
  echo "models rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
( CUDA_VISIBLE_DEVICES=1 timeout 260 taskset -c 16-31 python3 -m bench --workloads \
    vision_sizes,churn,multistream --configs $C --variant $M --pairs 8 --processes 3 --budget-s 250 \
    --out-dir $R/vision > $R/vision.log 2>&1
  echo "vision rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
  python3 -m pip install -q --no-index --no-deps --target .tms .whl/torch_memory_saver-0.0.10-*.whl \
    > $R/tms-install.txt 2>&1
  CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$PWD/python:$PWD/.tms timeout 150 taskset -c 16-31 \
    python3 -m bench --group sleep --out-dir $R/sleep > $R/sleep.log 2>&1
  echo "sleep rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt ) &
wait
cat $R/times.txt
grep -E "given back|sleep " $R/sleep/report.md | head -8
for n in models vision; do grep -A8 "^| workload | native | native-aa" $R/$n/report.md | head -6; grep -A9 "^## Peak device memory" $R/$n/report.md | grep '^| `'; done
tar czf $OUT/g3.tgz -C $OUT r
