#!/usr/bin/env bash
# Call 3 (two H200s): where vmm's peak memory on BERT went from 470 MiB (library 49f0430, the
# full run of 2026-11-29) to 528 MiB (a56a80b and ea0e4b1, this session's runs): the floor
# diagnostic's BERT child (bench/diag_floor.py: drop of free memory at the peak step, reserved
# bytes since the start, live peak) under the libraries of commits along the way, twice each,
# native twice; the two GPUs take alternate runs.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
R=$OUT/r; mkdir -p $R; nvidia-smi -L > $R/gpus.txt 2>&1; t0=$(date +%s)
run() {  # gpu cpus label library config
  CUDA_VISIBLE_DEVICES=$1 STREAMPOOL_LIBRARY=$PWD/.gpu/lib-$4.so STREAMPOOL_BACKEND=vmm \
    timeout 200 taskset -c $2 python3 bench/diag_floor.py --child $5 bert > $R/$3.log 2>&1
  echo "$3 rc=$? $(( $(date +%s)-t0 ))s $(grep -h FLOOR $R/$3.log | head -n 1)" >> $R/floor.txt
}
( for i in 1 2; do run 0 0-15 native-$i a56a80b native; run 0 0-15 vmm-49f0430-$i 49f0430 vmm
    run 0 0-15 vmm-c3cc549-$i c3cc549 vmm; done ) &
( for i in 1 2; do run 1 16-31 vmm-cf543e1-$i cf543e1 vmm; run 1 16-31 vmm-3a7c549-$i 3a7c549 vmm
    run 1 16-31 vmm-a56a80b-$i a56a80b vmm; done ) &
wait
sort $R/floor.txt
tar czf $OUT/g3.tgz -C $OUT r && rm -rf $R
