#!/usr/bin/env bash
# Diagnostic call: vision_sizes steps with and without remapping in the timed steps.
set -u
export PYTHONPATH=$PWD:$PWD/python PYTHONUNBUFFERED=1 STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool.so
R=$OUT/r; mkdir -p $R; t0=$(date +%s)
one() { # name, env...
  local name=$1; shift
  env "$@" timeout 100 taskset -c 12-15 python3 bench/diag_steps.py --child $name vision_sizes 2>&1 | grep "^STEPS\|Error" | tee -a $R/steps.txt
}
X="STREAMPOOL_BACKEND=vmm STREAMPOOL_VMM_COLD_AFTER=1s STREAMPOOL_VMM_GROWTH_SLACK=5%"
for i in 1 2; do
  one native
  one vmm STREAMPOOL_BACKEND=vmm
  one vmm-noremap $X
  one vmm-noremap $X
  one vmm STREAMPOOL_BACKEND=vmm
  one native
done
env $X STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-counts.so timeout 100 taskset -c 12-15 python3 bench/diag_steps.py --child vmm-noremap vision_sizes > $R/calls-noremap.txt 2>&1
grep "^CALLS" $R/calls-noremap.txt | head -12
echo "$(( $(date +%s)-t0 ))s"
tar czf $OUT/d3.tgz -C $OUT r && rm -rf $R
