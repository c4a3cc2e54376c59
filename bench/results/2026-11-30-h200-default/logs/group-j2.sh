#!/usr/bin/env bash
# Call $CALL (one H200) of the full run of the library of BUILT_FROM (vmm the default): the group
# $GROUP alone on the GPU, with the settings of bench/calibration.json.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R/logs; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/$CALL.sh $R/logs/$CALL.sh
C=native,native-aa,expandable,streampool,streampool-pool
t0=$(date +%s); T=$R/logs/$CALL-times.txt
timeout 575 python3 -m bench --group $GROUP --configs $C --out-dir $R/$GROUP > $R/logs/$GROUP.log 2>&1
echo "$GROUP rc=$? $(( $(date +%s)-t0 ))s" >> $T
cat $T; tail -14 $R/logs/$GROUP.log
tar czf $OUT/$CALL.tgz -C $OUT r
