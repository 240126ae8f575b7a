# Sourced by the device scripts (device_run.sh, capacity_run.sh, sglang_run.sh, noise_run.sh,
# engines_run.sh, trialcost_run.sh, fvf_run.sh).  The chain they write to $Q/chain.sh
# runs in its own session (setsid), so it outlives the call that started it; each
# call then waits for it up to $LIMIT seconds (a call may run 600 s).
start_chain() {
  setsid nohup bash $Q/chain.sh > $Q/chain.out 2>&1 < /dev/null &
}
wait_chain() {
  local limit=${LIMIT:-570}
  while [ ! -f $Q/DONE ] && [ $(( $(date +%s)-T_CALL )) -lt $limit ]; do sleep 5; done
  echo "elapsed since start: $(( $(date +%s)-$(cat $Q/t0) ))s; done=$([ -f $Q/DONE ] && echo yes || echo no)"
  cat $Q/chain.log 2>/dev/null
}
# join_parts DIR SHA: the carried parts copied into DIR (part.NN), joined in order,
# checked against SHA (a sha256sum line for all.tar) and unpacked in DIR; exit 3 if not.
join_parts() {
  (cd $1 && cat $(ls part.* | sort -t. -k2 -n) > all.tar && sha256sum -c $2 && tar xf all.tar \
    && rm -f part.* all.tar) || exit 3
}
# put_back_flash_ops DIR SITE: sgl_kernel's FA3 library (1.1 GB, 383 MB in its wheel)
# travels xz-compressed (148 MB) as DIR/flash_ops.xz; back into the install in SITE.
put_back_flash_ops() {
  xz -dc $1/flash_ops.xz > $2/sgl_kernel/flash_ops.abi3.so || exit 3
}
# vllm_recipe_init: what the vLLM-wheel recipes (trialcost_run.sh, fvf_run.sh,
# holdcheck_run.sh) set before their steps: quiet, unbuffered Python with no PYTHONPATH
# of the caller's, the chain's folder $Q, the wheel folder, and the call's start $T_CALL.
vllm_recipe_init() {
  export PYTHONUNBUFFERED=1 DO_NOT_TRACK=1 VLLM_NO_USAGE_STATS=1
  unset PYTHONPATH
  Q=/tmp/qt; mkdir -p $Q /tmp/wh/v
  T_CALL=$(date +%s)
}
# copy_part N: the carried vLLM part .vwheels/pN into /tmp/wh/v (one part a call,
# under the carry limit).
copy_part() {
  cp .vwheels/p$1/* /tmp/wh/v/ && ls /tmp/wh/v | tr '\n' ' ' && nvidia-smi -L
}
# copy_repo: the repo as the chain runs it, /tmp/qrepo (the call's start time in
# $Q/t0); sets REPO to the carried tree.
copy_repo() {
  date +%s > $Q/t0; REPO=$PWD
  rm -rf /tmp/qrepo && mkdir -p /tmp/qrepo && cp -r qtune examples benchmarks pyproject.toml \
    /tmp/qrepo/ && mkdir -p /tmp/qrepo/studies /tmp/qrepo/profiles
}
# image_venv VENV: a venv that sees the image's packages (its torch) after its own;
# sets SP to its site-packages and IMAGE_SITE to the image's; exit 3 if it cannot.
image_venv() {
  IMAGE_SITE=$(python3 -c "import site; print(site.getsitepackages()[0])")
  python3 -m venv --without-pip $1 || exit 3
  SP=$($1/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "import site; site.addsitedir('$IMAGE_SITE')" > $SP/zz-image-site.pth
}
# install_vllm_venv: what the vLLM recipes' "start" does before their chain: copy
# the repo to /tmp/qrepo, the last part (.vwheels/p$LAST; all.sha and .qwheels
# carried with it), join and check the set, install it into /tmp/venv-vllm, a venv
# that sees the image's torch after its own packages, then probe.  Sets REPO and
# leaves the shell in /tmp/qrepo; exit 3 if the set is not whole.
install_vllm_venv() {
  copy_repo
  cp .vwheels/p${LAST:-7}/* /tmp/wh/v/ || exit 3
  t=$(date +%s)
  join_parts /tmp/wh/v $REPO/.vwheels/all.sha; cd /tmp/wh/v
  venv=/tmp/venv-vllm
  image_venv $venv
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
}
# fvf_chain JSON CONSOLE: write the chain that runs benchmarks/capacity_fast_vs_full.py
# with issue 27's workload (fvf_run.sh's "start", noise_run.sh's "fvf"): $CONFIGS (JSON
# launch params; default the engine defaults and run 13's winner), $CONTROL and $FVF_ARGS
# as that script takes them; its JSON to $Q/JSON, its console to $Q/CONSOLE.  The configs
# travel in a file (run 14's first chain start lost them to quoting: the '}' of '{}' ends
# a ${VAR:-default} expansion).
fvf_chain() {
  local run13_winner='{"max_num_seqs": 442, "max_num_batched_tokens": 4096, "stream_interval": 1, "max_cudagraph_capture_size": 256}'
  local configs=${CONFIGS:-}; [ -n "$configs" ] || configs="[{}, $run13_winner]"
  printf '%s' "$configs" > $Q/cfg.json
  echo 'CONFIGS=$(cat /tmp/qt/cfg.json)' > $Q/chain.sh
  echo "CONTROL='${CONTROL:-}'; FVF_ARGS='${FVF_ARGS:-}'; OUT_JSON='$1'; OUT_TXT='$2'" >> $Q/chain.sh
  cat >> $Q/chain.sh <<'EOC'
cd /tmp/qrepo; Q=/tmp/qt; PY=/tmp/venv-vllm/bin/python
s=$(date +%s)
$PY benchmarks/capacity_fast_vs_full.py $FVF_ARGS --model examples/qwen3-4b --configs "$CONFIGS" \
  --input-len 1024 --output-len 256 --rate 16 --requests 400 --warmup 160 \
  --slo 'ttft_p99<=500ms,tpot_p99<=20ms' --no-floor ${CONTROL:+--control $CONTROL} --json $Q/$OUT_JSON > $Q/$OUT_TXT 2>&1
echo "fvf rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
touch $Q/DONE
EOC
}
