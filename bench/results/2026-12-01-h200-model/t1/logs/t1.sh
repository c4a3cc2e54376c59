#!/usr/bin/env bash
# Job t1 (one H200): fresh allocation traces of gpt2, resnet50, bert and vision_sizes under native
# (bench/trace_capture.py), to replay against the model of expandable segments; then how the peaks
# of bert, vision_sizes and resnet50 divide (bench/diag_floor.py) under expandable segments and
# vmm (library .gpu/d/BUILT_FROM), each configuration in a process of its own.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
R=$OUT/r; mkdir -p $R/logs $R/traces; cp .gpu/t1.sh $R/logs/
cat .gpu/d/BUILT_FROM > $R/built_from.txt
nvidia-smi > $R/nvidia-smi.txt 2>&1
t0=$(date +%s)
timeout 300 python3 -m bench.trace_capture --workloads gpt2,resnet50,bert,vision_sizes \
  --out $R/traces --budget-s 290 > $R/logs/capture.log 2>&1
echo "capture rc=$? $(( $(date +%s)-t0 ))s" >> $R/logs/times.txt
F=$R/floor.txt
one() { # label workload config [env...]
  local label=$1 w=$2 c=$3; shift 3
  env "$@" timeout 100 python3 bench/diag_floor.py --child $c $w 2>&1 | grep -E "FLOOR|Error" | sed "s/^/$label /" >> $F
  echo "$label $w $(( $(date +%s)-t0 ))s" >> $R/logs/times.txt
}
for w in bert vision_sizes resnet50; do
  [ $(( $(date +%s)-t0 )) -gt 500 ] && break
  one expandable $w expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  one vmm-D $w vmm STREAMPOOL_BACKEND=vmm STREAMPOOL_LIBRARY=$PWD/.gpu/d/libstreampool.so
done
cat $R/logs/times.txt $F; tail -8 $R/logs/capture.log
tar czf $OUT/t1.tgz -C $OUT r
