#!/usr/bin/env bash
# Job q1 (one H200): the price of STREAMPOOL_RELEASE_THRESHOLD=1GiB on GPT-2, process by process.
# The benchmark's own sequence (bench/diag_sequence.py: memory pass, then 20 blocks of 7 timed
# steps with an idle gap) in five processes with the threshold and two without, one after the
# other; each block's time and streampool's counters (pages mapped and unmapped, handles created
# and released) moved in it. The 2026-11-30 run's price split its processes: 1.04 and 1.06
# against 1.44-1.51; this asks whether the driver work a block does splits the same way.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/b/libstreampool.so
R=$OUT/r; mkdir -p $R/logs; cat .gpu/b/BUILT_FROM > $R/built_from.txt; cp .gpu/seq.sh $R/logs/
t0=$(date +%s); T=$R/logs/times.txt
for run in t1 n1 t2 t3 n2 t4 t5; do
  case $run in t*) th=1GiB ;; *) th= ;; esac
  if [ -n "$th" ]; then export STREAMPOOL_RELEASE_THRESHOLD=$th; else unset STREAMPOOL_RELEASE_THRESHOLD; fi
  timeout 90 python3 -m bench.diag_sequence gpt2 > $R/$run.txt 2>&1
  echo "$run threshold=${th:-unset} rc=$? $(( $(date +%s)-t0 ))s" >> $T
done
cat $T
for f in $R/t*.txt $R/n*.txt; do
  echo "== $(basename $f)"; grep "memory pass" $f | cut -c1-200
  grep "block" $f | awk '{t+=$5; n++} END {printf "blocks %d, mean %.1f ms\n", n, t/n}'
  grep "block" $f | sed -n '2p;10p;20p' | cut -c1-200
done
tar czf $OUT/q1.tgz -C $OUT r
