#!/usr/bin/env bash
# Job g1 (one H200): how each workload's peak divides (bench/diag_floor.py: device memory, the
# allocator's reserved bytes, what lies outside any allocator), native and expandable segments
# against vmm under library A (.gpu/b/BUILT_FROM) and library B (.gpu/c/BUILT_FROM), alternated,
# each configuration in a process of its own.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
R=$OUT/r; mkdir -p $R/logs; cp .gpu/floorab.sh $R/logs/
echo "A $(cat .gpu/b/BUILT_FROM) B $(cat .gpu/c/BUILT_FROM)" > $R/built_from.txt
nvidia-smi > $R/nvidia-smi.txt 2>&1
F=$R/floor.txt; t0=$(date +%s)
one() { # label workload config [env...]
  local label=$1 w=$2 c=$3; shift 3
  env "$@" timeout 150 python3 bench/diag_floor.py --child $c $w 2>&1 | grep -E "FLOOR|Error" | sed "s/^/$label /" >> $F
  echo "$label $w $(( $(date +%s)-t0 ))s" >> $R/logs/times.txt
}
for w in multistream compiled; do
  one native $w native
  one expandable $w expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  one vmm-A $w vmm STREAMPOOL_BACKEND=vmm STREAMPOOL_LIBRARY=$PWD/.gpu/b/libstreampool.so
  one vmm-B $w vmm STREAMPOOL_BACKEND=vmm STREAMPOOL_LIBRARY=$PWD/.gpu/c/libstreampool.so
  one vmm-A $w vmm STREAMPOOL_BACKEND=vmm STREAMPOOL_LIBRARY=$PWD/.gpu/b/libstreampool.so
  one vmm-B $w vmm STREAMPOOL_BACKEND=vmm STREAMPOOL_LIBRARY=$PWD/.gpu/c/libstreampool.so
done
for w in gpt2; do
  one vmm-A $w vmm STREAMPOOL_BACKEND=vmm STREAMPOOL_LIBRARY=$PWD/.gpu/b/libstreampool.so
  one vmm-B $w vmm STREAMPOOL_BACKEND=vmm STREAMPOOL_LIBRARY=$PWD/.gpu/c/libstreampool.so
  one expandable $w expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
done
cat $F; tail -1 $R/logs/times.txt
tar czf $OUT/g1.tgz -C $OUT r
