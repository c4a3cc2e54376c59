#!/usr/bin/env bash
# Job t3 (one H200): the benchmark's memory figure with what the allocator held idle at the
# start counted (bench/worker.py), on bert, vision_sizes and gpt2: one process set, two pairs
# (the memory pass is what this job is for; the times are not a result).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/d/libstreampool.so
R=$OUT/r; mkdir -p $R/logs; cp .gpu/t3.sh $R/logs/; cat .gpu/d/BUILT_FROM > $R/built_from.txt
t0=$(date +%s)
timeout 500 python3 -m bench --workloads bert,vision_sizes,gpt2 --configs native,expandable,streampool \
  --pairs 2 --processes 1 --calibration none --out-dir $R/memory > $R/logs/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s)-t0 ))s" > $R/logs/times.txt
python3 - "$R/memory/results.json" > $R/memory-figures.txt <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for run in d["runs"]:
    for w in run["workloads"]:
        for c, p in sorted(w["prepare"].items()):
            f = lambda k: None if p.get(k) is None else round(p[k] / 2**20, 1)
            print(w["workload"], c, "peak_device", f("peak_device_bytes"), "grown", f("peak_grown_bytes"),
                  "idle_at_start", f("idle_reserved_at_start_bytes"), "live", f("peak_live_bytes"))
PY
cat $R/logs/times.txt $R/memory-figures.txt; tail -5 $R/logs/bench.log
tar czf $OUT/t3.tgz -C $OUT r
