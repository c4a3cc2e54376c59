#!/usr/bin/env bash
# Diagnostic call: inside-the-allocator time and driver calls of timed rounds only (5 rounds less 1).
set -u
export PYTHONPATH=$PWD:$PWD/python PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; t0=$(date +%s)
for b in vmm pool; do for n in 1 5; do
  STREAMPOOL_BACKEND=$b STREAMPOOL_LIBRARY=$PWD/.gpu/libstreampool-counts.so DIAG_ROUNDS=$n \
    timeout 100 taskset -c 12-15 python3 bench/diag_steps.py --child $b vision_sizes > $R/calls-$b-$n.txt 2>&1
  echo "calls $b $n rc=$? $(( $(date +%s)-t0 ))s" >> $R/times.txt
done; done
cat $R/times.txt
python3 - $R <<'PY'
import re,sys,glob
R=sys.argv[1]
def load(p):
    d={}
    for l in open(p):
        m=re.match(r"CALLS (\S+) (\d+)(?: total_us (\d+))?",l)
        if m: d[m[1]]=(int(m[2]),int(m[3] or 0))
    return d
for b in ("vmm","pool"):
    a,z=load(f"{R}/calls-{b}-1.txt"),load(f"{R}/calls-{b}-5.txt")
    steps=4*24
    print(f"== {b}: per timed step (4 rounds x 24 steps), calls and us")
    for k in sorted(z,key=lambda k:-(z[k][1]-a.get(k,(0,0))[1])):
        dc=z[k][0]-a.get(k,(0,0))[0]; du=z[k][1]-a.get(k,(0,0))[1]
        if dc: print(f"  {k:40s} {dc/steps:9.2f} calls {du/steps:9.1f} us")
PY
grep -h "^STEPS" $R/calls-*.txt
tar czf $OUT/d2.tgz -C $OUT r && rm -rf $R
