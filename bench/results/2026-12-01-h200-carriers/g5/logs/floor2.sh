#!/usr/bin/env bash
# Job g5 (one H200): the final library (.gpu/d/BUILT_FROM) against library A (.gpu/b/BUILT_FROM):
# multistream's and GPT-2's memory pass (bench/diag_floor.py), alternated, each in its own process;
# then the benchmark's multistream (memory pass and paired timed blocks) with the final library.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_BACKEND=vmm
R=$OUT/r; mkdir -p $R/logs; cp .gpu/floor2.sh $R/logs/
echo "A $(cat .gpu/b/BUILT_FROM) D $(cat .gpu/d/BUILT_FROM)" > $R/built_from.txt
t0=$(date +%s)
for w in multistream gpt2; do
  for lib in d b d; do
    STREAMPOOL_LIBRARY=$PWD/.gpu/$lib/libstreampool.so timeout 100 python3 bench/diag_floor.py --child vmm $w 2>&1 | grep -E "FLOOR|Error" | sed "s/^/vmm-$lib $(cat .gpu/$lib/BUILT_FROM) /" >> $R/floor.txt
    echo "$lib $w $(( $(date +%s)-t0 ))s" >> $R/logs/times.txt
  done
done
# then the benchmark's multistream with the final library
C=native,native-aa,expandable,streampool,streampool-pool
echo "python3 -m bench --workloads multistream --configs $C --out-dir multistream" > $R/logs/command.txt
STREAMPOOL_LIBRARY=$PWD/.gpu/d/libstreampool.so timeout 200 env -u STREAMPOOL_BACKEND python3 -m bench --workloads multistream --configs $C --out-dir $R/multistream > $R/logs/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s)-t0 ))s" >> $R/logs/times.txt
cat $R/floor.txt; tail -2 $R/logs/times.txt; grep "multistream\` (" $R/multistream/report.md | head -2
tar czf $OUT/g5.tgz -C $OUT r
