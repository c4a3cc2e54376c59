#!/usr/bin/env bash
# Job g1 (one H200): how the peaks divide (bench/diag_floor.py) under vmm for the library whose
# carriers join (.gpu/d/BUILT_FROM), each workload in a process of its own, to set beside the
# replay; then the benchmark's alloc group (torch.empty loops, churn) with the A/A control.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
R=$OUT/r; mkdir -p $R/logs; cp .gpu/g1.sh $R/logs/
cat .gpu/d/BUILT_FROM > $R/built_from.txt
nvidia-smi > $R/nvidia-smi.txt 2>&1
t0=$(date +%s)
F=$R/floor.txt
one() { # label workload config [env...]
  local label=$1 w=$2 c=$3; shift 3
  env "$@" timeout 100 python3 bench/diag_floor.py --child $c $w 2>&1 | grep -E "FLOOR|Error" | sed "s/^/$label /" >> $F
  echo "$label $w $(( $(date +%s)-t0 ))s" >> $R/logs/times.txt
}
for w in bert churn llama_decode vision_sizes gpt2 resnet50; do
  [ $(( $(date +%s)-t0 )) -gt 230 ] && break
  one vmm-D $w vmm STREAMPOOL_BACKEND=vmm STREAMPOOL_LIBRARY=$PWD/.gpu/d/libstreampool.so
done
C=native,native-aa,expandable,streampool,streampool-pool
echo "python3 -m bench --group alloc --configs $C --out-dir alloc" > $R/logs/command.txt
STREAMPOOL_LIBRARY=$PWD/.gpu/d/libstreampool.so timeout 330 python3 -m bench --group alloc \
  --configs $C --out-dir $R/alloc > $R/logs/bench.log 2>&1
echo "alloc rc=$? $(( $(date +%s)-t0 ))s" >> $R/logs/times.txt
cat $R/logs/times.txt $F; grep -A10 "^| workload" $R/alloc/report.md | head -12
tar czf $OUT/g1.tgz -C $OUT r
