#!/usr/bin/env bash
# Job g2 (one H200): the benchmark's multistream workload (memory pass and paired timed blocks,
# the A/A control beside it) with library B (.gpu/c/BUILT_FROM), settings of bench/calibration.json;
# then GPT-2's memory pass under libraries A (.gpu/b) and B alternated.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/c/libstreampool.so
R=$OUT/r; mkdir -p $R/logs; cat .gpu/c/BUILT_FROM > $R/built_from.txt; cp .gpu/ms.sh $R/logs/
C=native,native-aa,expandable,streampool,streampool-pool
t0=$(date +%s)
echo "python3 -m bench --workloads ${W:-multistream} --configs $C --out-dir ${NAME:-multistream}" > $R/logs/command.txt
timeout ${LIMIT_S:-400} python3 -m bench --workloads ${W:-multistream} --configs $C --out-dir $R/${NAME:-multistream} > $R/logs/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s)-t0 ))s" > $R/logs/times.txt
# GPT-2's memory pass again, libraries A and B alternated (bench/diag_floor.py), twice each
for lib in ${FLOOR_LIBS-b c b c}; do
  STREAMPOOL_BACKEND=vmm STREAMPOOL_LIBRARY=$PWD/.gpu/$lib/libstreampool.so timeout 150 python3 bench/diag_floor.py --child vmm gpt2 2>&1 | grep -E "FLOOR|Error" | sed "s/^/vmm-$lib $(cat .gpu/$lib/BUILT_FROM) /" >> $R/floor-gpt2.txt
done
echo "floor $(( $(date +%s)-t0 ))s" >> $R/logs/times.txt
cat $R/logs/times.txt $R/floor-gpt2.txt; tail -14 $R/logs/bench.log
tar czf $OUT/g2.tgz -C $OUT r
