#!/usr/bin/env bash
# The rest of the full run of the library of BUILT_FROM (vmm the default), after alloc, compiled
# and models: call $CALL runs its parts one after another, each alone on the GPU with the settings
# of bench/calibration.json and a limit of its own, so that one part's overrun keeps the others.
#   v1: resnet50 (vision group, first part), co-tenant trials
#   v2: vision_sizes (vision group, second part), sleep
#   v3: vision_sizes again, alone (v2's limit of 330 s stopped it in its seventh process set)
#   p1: co-tenant price (GPT-2 at six configurations)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R/logs; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/rest.sh $R/logs/rest.sh
nvidia-smi > $R/logs/$CALL-nvidia-smi.txt 2>&1
C=native,native-aa,expandable,streampool,streampool-pool
t0=$(date +%s); T=$R/logs/$CALL-times.txt
part() { # NAME LIMIT_S ARGS...
  local name=$1 limit=$2; shift 2
  echo "CALL=$CALL python3 -m bench $*" >> $R/logs/$CALL-command.txt
  timeout $limit python3 -m bench "$@" > $R/logs/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s)-t0 ))s" >> $T
  tail -12 $R/logs/$name.log
}
case $CALL in
v1) part vision-a 330 --workloads resnet50 --configs $C --out-dir $R/vision-a
    part cotenant-trials 250 --group cotenant --cotenant-without-price --configs $C --out-dir $R/cotenant-trials ;;
v2) part vision-b 330 --workloads vision_sizes --configs $C --out-dir $R/vision-b
    python3 -m pip install -q --no-index --no-deps --target .tms .whl/torch_memory_saver-0.0.10-*.whl > $R/tms-install.txt 2>&1
    PYTHONPATH=$PWD/python:$PWD/.tms part sleep 250 --group sleep --out-dir $R/sleep ;;
v3) part vision-b 425 --workloads vision_sizes --configs $C --out-dir $R/vision-b ;;
p1) part cotenant-price 560 --workloads gpt2 --out-dir $R/cotenant-price \
      --configs native,native-aa,streampool,streampool-threshold-1GiB,streampool-pool,streampool-pool-threshold-1GiB ;;
esac
cat $T
tar czf $OUT/$CALL.tgz -C $OUT r
