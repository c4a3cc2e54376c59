#!/usr/bin/env bash
# Job t2 (one H200): a fresh allocation trace of llama_decode under native
# (bench/trace_capture.py); then how the peaks of churn, llama_decode and gpt2 divide
# (bench/diag_floor.py) under expandable segments and vmm (library .gpu/d/BUILT_FROM), each
# configuration in a process of its own: the GPU's figures for the replay's model of expandable
# segments.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
R=$OUT/r; mkdir -p $R/logs $R/traces; cp .gpu/t2.sh $R/logs/
cat .gpu/d/BUILT_FROM > $R/built_from.txt
t0=$(date +%s)
timeout 150 python3 -m bench.trace_capture --workloads llama_decode \
  --out $R/traces --budget-s 140 > $R/logs/capture.log 2>&1
echo "capture rc=$? $(( $(date +%s)-t0 ))s" >> $R/logs/times.txt
F=$R/floor.txt
one() { # label workload config [env...]
  local label=$1 w=$2 c=$3; shift 3
  env "$@" timeout 100 python3 bench/diag_floor.py --child $c $w 2>&1 | grep -E "FLOOR|Error" | sed "s/^/$label /" >> $F
  echo "$label $w $(( $(date +%s)-t0 ))s" >> $R/logs/times.txt
}
for w in churn llama_decode gpt2; do
  one expandable $w expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  one vmm-D $w vmm STREAMPOOL_BACKEND=vmm STREAMPOOL_LIBRARY=$PWD/.gpu/d/libstreampool.so
done
one expandable gpt2 expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
cat $R/logs/times.txt $F; tail -3 $R/logs/capture.log
tar czf $OUT/t2.tgz -C $OUT r
