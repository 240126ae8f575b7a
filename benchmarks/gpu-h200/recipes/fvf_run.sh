#!/bin/bash
# The fast capacity procedure against the full one on the lent H200 (issue 27's "done
# when": 2 configs on the H200), with issue 27's workload (Qwen3-4B shape, random weights,
# 1024/256 tokens, --rate 16, 400 requests, warm-up 160, ttft_p99<=500ms,tpot_p99<=20ms):
# benchmarks/capacity_fast_vs_full.py on the engine defaults and run 13's winner, each on
# one server, both procedures in turn (order alternated).  Usage as trialcost_run.sh:
#   fvf_run.sh copy N | start | wait
set -u
. "$(dirname "$0")/chain_lib.sh"
export PYTHONUNBUFFERED=1 DO_NOT_TRACK=1 VLLM_NO_USAGE_STATS=1
unset PYTHONPATH
Q=/tmp/qt; mkdir -p $Q /tmp/wh/v
T_CALL=$(date +%s)
case "$1" in
copy)
  cp .vwheels/p$2/* /tmp/wh/v/ && ls /tmp/wh/v | tr '\n' ' ' && nvidia-smi -L; exit 0 ;;
start)
  date +%s > $Q/t0; REPO=$PWD
  rm -rf /tmp/qrepo && mkdir -p /tmp/qrepo && cp -r qtune examples benchmarks pyproject.toml \
    /tmp/qrepo/ && mkdir -p /tmp/qrepo/studies /tmp/qrepo/profiles
  cp .vwheels/p${LAST:-7}/* /tmp/wh/v/ || exit 3
  t=$(date +%s)
  IMAGE_SITE=$(python3 -c "import site; print(site.getsitepackages()[0])")
  join_parts /tmp/wh/v $REPO/.vwheels/all.sha; cd /tmp/wh/v
  venv=/tmp/venv-vllm
  python3 -m venv --without-pip $venv || exit 3
  SP=$($venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "import site; site.addsitedir('$IMAGE_SITE')" > $SP/zz-image-site.pth
  # .qwheels (carried with the last part): qtune's CLI stack at the versions CI tests
  # (typer, click, rich and theirs), over whatever the image holds
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SP \
    /tmp/wh/v/w/*.whl $REPO/.qwheels/*.whl 2>&1 | tail -3
  xz -dc vllm-tree.tar.xz | tar xf - -C $SP
  # pip compiles what it installs unless told not to (--no-compile above, to
  # keep the install short): without the bytecode each server process of the
  # first trial compiles vLLM's modules again (run 12: 68 s of process start)
  $venv/bin/python -m compileall -q -j 16 $SP > /dev/null 2>&1
  echo "install_s=$(( $(date +%s)-t ))"
  cd /tmp/qrepo
  $venv/bin/python -c "import vllm, torch, optuna; print('vllm', vllm.__version__, 'torch', torch.__version__, 'optuna', optuna.__version__)" 2>&1 | grep -v -i warn | tail -1
  $venv/bin/python -m qtune probe > $Q/probe.txt 2>&1; echo "probe rc=$?"
  nvidia-smi -L
  # the configs travel in a file (run 14's first chain start lost them to quoting:
  # the '}' of '{}' ends a ${VAR:-default} expansion)
  run13_winner='{"max_num_seqs": 442, "max_num_batched_tokens": 4096, "stream_interval": 1, "max_cudagraph_capture_size": 256}'
  configs=${CONFIGS:-}; [ -n "$configs" ] || configs="[{}, $run13_winner]"
  printf '%s' "$configs" > $Q/cfg.json
  echo 'CONFIGS=$(cat /tmp/qt/cfg.json)' > $Q/chain.sh
  cat >> $Q/chain.sh <<'EOC'
cd /tmp/qrepo; Q=/tmp/qt; PY=/tmp/venv-vllm/bin/python
s=$(date +%s)
$PY benchmarks/capacity_fast_vs_full.py --model examples/qwen3-4b --configs "$CONFIGS" \
  --input-len 1024 --output-len 256 --rate 16 --requests 400 --warmup 160 \
  --slo 'ttft_p99<=500ms,tpot_p99<=20ms' --no-floor --json $Q/result.json > $Q/console.txt 2>&1
echo "fvf rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
touch $Q/DONE
EOC
  start_chain
  ;;
esac
wait_chain
for f in result.json console.txt; do [ -f $Q/$f ] && cp $Q/$f $OUT/; done
tar czf $OUT/logs.tgz -C /tmp $(cd /tmp && ls -d qtune-fvf-* 2>/dev/null) 2>/dev/null
tail -c 3000 $Q/console.txt 2>/dev/null
