#!/usr/bin/env bash
# Call $CALL (one H200) of the full run of the library of BUILT_FROM (vmm the default): the group
# $GROUP (or the workloads $W, as one group written to $NAME) alone on the GPU, with the settings
# of bench/calibration.json.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R/logs; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/group.sh $R/logs/group.sh
C=native,native-aa,expandable,streampool,streampool-pool
if [ -n "${W:-}" ]; then SEL="--workloads $W"; else SEL="--group $GROUP"; NAME=$GROUP; fi
t0=$(date +%s); T=$R/logs/$CALL-times.txt
echo "CALL=$CALL python3 -m bench $SEL --configs $C --out-dir $NAME" >> $R/logs/$CALL-command.txt
timeout 575 python3 -m bench $SEL --configs $C --out-dir $R/$NAME > $R/logs/$NAME.log 2>&1
echo "$NAME rc=$? $(( $(date +%s)-t0 ))s" >> $T
cat $T; tail -14 $R/logs/$NAME.log
tar czf $OUT/$CALL.tgz -C $OUT r
