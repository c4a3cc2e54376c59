#!/usr/bin/env bash
# Job t4 (one H200): the benchmark's memory pass of bert after the engine's statistics were
# gathered in one place (bench/engine.py allocator_stats): one process set, one pair.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python STREAMPOOL_LIBRARY=$PWD/.gpu/d/libstreampool.so
R=$OUT/r; mkdir -p $R/logs; cp .gpu/t4.sh $R/logs/; git rev-parse HEAD > $R/logs/commit.txt 2>/dev/null
timeout 300 python3 -m bench --workloads bert --configs native,expandable,streampool \
  --pairs 1 --processes 1 --calibration none --out-dir $R/bert > $R/logs/bench.log 2>&1
echo "bench rc=$?"; grep "memory pass" $R/logs/bench.log
