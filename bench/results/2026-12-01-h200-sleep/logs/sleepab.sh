#!/usr/bin/env bash
# Job s1 (one H200): the sleep change A/B. The sleep group's two vmm configurations with the
# library of A (.gpu/libstreampool.so) and of B (.gpu/b/libstreampool.so), alternated twice (each
# child measures the host link it is compared with), then the whole sleep group (native, vmm,
# vmm-reserved, torch_memory_saver) on B.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
R=$OUT/r; mkdir -p $R/logs; cp .gpu/sleepab.sh $R/logs/
echo "A $(cat .gpu/BUILT_FROM) B $(cat .gpu/b/BUILT_FROM)" > $R/built_from.txt
nvidia-smi > $R/nvidia-smi.txt 2>&1
python3 -m pip install -q --no-index --no-deps --target .tms .whl/torch_memory_saver-0.0.10-*.whl > $R/tms-install.txt 2>&1
t0=$(date +%s); T=$R/logs/times.txt
for i in 1 2; do for L in a b; do
  lib=$PWD/.gpu/libstreampool.so; [ $L = b ] && lib=$PWD/.gpu/b/libstreampool.so
  STREAMPOOL_LIBRARY=$lib timeout 110 python3 -m bench.sleep --configs streampool-vmm,streampool-vmm-reserved \
    --out-dir $R/ab/$L$i > $R/logs/$L$i.log 2>&1
  echo "$L$i rc=$? $(( $(date +%s)-t0 ))s" >> $T
done; done
STREAMPOOL_LIBRARY=$PWD/.gpu/b/libstreampool.so PYTHONPATH=$PWD/python:$PWD/.tms timeout 160 \
  python3 -m bench --group sleep --out-dir $R/sleep > $R/logs/sleep.log 2>&1
echo "sleep rc=$? $(( $(date +%s)-t0 ))s" >> $T
cat $T
for f in $R/ab/*/sleep.md $R/sleep/sleep/sleep.md; do echo "== ${f#$R/}"; grep '^| `' $f | head -4 | cut -c1-230; done
tar czf $OUT/s1.tgz -C $OUT r
