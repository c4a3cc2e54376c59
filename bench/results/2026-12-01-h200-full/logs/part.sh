#!/usr/bin/env bash
# Call $CALL (one GPU) of the full run of the library of BUILT_FROM (vmm the default): one part
# alone on the GPU, with the settings of bench/calibration.json:
#   CALL=c1 NAME=cotenant-trials SEL="--group cotenant --cotenant-without-price" bash .gpu/part.sh
#   CALL=c2 NAME=cotenant-price  SEL="--workloads gpt2" \
#     CONFIGS=native,native-aa,streampool,streampool-threshold-1GiB,streampool-pool,streampool-pool-threshold-1GiB bash .gpu/part.sh
# $OUT: the folder whose contents come back (the results folder of the run is made from it).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R/logs; cat .gpu/BUILT_FROM > $R/built_from.txt; cp .gpu/part.sh $R/logs/part.sh
C=${CONFIGS:-native,native-aa,expandable,streampool,streampool-pool}
t0=$(date +%s); T=$R/logs/$CALL-times.txt
echo "CALL=$CALL python3 -m bench $SEL --configs $C --out-dir $NAME" >> $R/logs/$CALL-command.txt
timeout ${LIMIT_S:-575} python3 -m bench $SEL --configs $C --out-dir $R/$NAME > $R/logs/$NAME.log 2>&1
echo "$NAME rc=$? $(( $(date +%s)-t0 ))s" >> $T
cat $T; tail -14 $R/logs/$NAME.log
tar czf $OUT/$CALL.tgz -C $OUT r
