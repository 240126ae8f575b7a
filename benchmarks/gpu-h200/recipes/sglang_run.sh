#!/bin/bash
# SGLang on the lent H200: runs on the device machine from the repo copy.  Usage:
#   sglang_run.sh copy N   copy the carried part .sgwheels/pN to /tmp/wh (parts of 40 MiB:
#                          the repo, 19.5 MiB, and one part must stay under 64 MiB)
#   sglang_run.sh start    copy the last part (.sgwheels/p$LAST, 8), join and check the parts,
#                          install into /tmp/site, put sgl_kernel's FA3 library back, check the
#                          imports, probe, then run search -> emit -> verify in the background
#                          (setsid), and wait
#   sglang_run.sh wait     wait for the background chain
# The parts hold SGLang 0.5.17 (the newest release that pins torch 2.11, the torch
# of the device's image), sglang-kernel 0.4.5 (cu130, torch 2.11) and the packages
# the image lacks (sglang_wheels.txt says which and why).  sgl_kernel's FA3 library
# (flash_ops.abi3.so, 1.1 GB, 383 MB in the wheel) travels xz-compressed (148 MB):
# four fewer copy calls.
# The study's extra flags come from $SEARCH_ARGS.  VERIFY_REPEAT=0 skips verify.
set -u
. "$(dirname "$0")/chain_lib.sh"
export PYTHONUNBUFFERED=1 DO_NOT_TRACK=1 SGLANG_DISABLE_REQUEST_LOGGING=1
export PYTHONPATH=/tmp/site:/tmp/qrepo
Q=/tmp/qt; mkdir -p $Q /tmp/wh
T_CALL=$(date +%s)
case "$1" in
copy)
  cp .sgwheels/p$2/* /tmp/wh/ && ls -la /tmp/wh | tail -2 && nvidia-smi -L; exit 0 ;;
start)
  date +%s > $Q/t0; REPO=$PWD
  rm -rf /tmp/qrepo && mkdir -p /tmp/qrepo && cp -r qtune examples pyproject.toml /tmp/qrepo/ \
    && mkdir -p /tmp/qrepo/studies /tmp/qrepo/profiles
  cp .sgwheels/p${LAST:-8}/* /tmp/wh/ || exit 3
  join_parts /tmp/wh $REPO/.sgwheels/all.sha
  t=$(date +%s); python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site /tmp/wh/w/*.whl 2>&1 | tail -3
  put_back_flash_ops /tmp/wh /tmp/site
  echo "install_s=$(( $(date +%s)-t ))"
  cd /tmp/qrepo
  python3 - <<'EOP' 2>&1 | grep -v "Warning\|warn(" | tail -8
import importlib, torch
print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))
for m in ("sglang", "sgl_kernel", "sgl_kernel.flash_attn", "flashinfer", "transformers",
          "sglang.srt.entrypoints.http_server", "sglang.srt.managers.scheduler",
          "sglang.srt.model_executor.model_runner", "optuna", "qtune.cli"):
    try:
        mod = importlib.import_module(m); print("ok", m, getattr(mod, "__version__", ""))
    except Exception as e:
        print("FAIL", m, type(e).__name__, str(e)[:300])
EOP
  python3 -m qtune probe --json > $Q/probe.json 2> $Q/probe.err; echo "probe json rc=$?"
  python3 -m qtune probe > $Q/probe.txt 2>&1; echo "probe rc=$?"
  python3 -m sglang.launch_server --help > $Q/sglang-help.txt 2>&1; echo "help rc=$?"
  echo "SEARCH_ARGS='${SEARCH_ARGS:---trials 6 --time-budget 9}'; VERIFY_REPEAT=${VERIFY_REPEAT:-2}" > $Q/chain.sh
  cat >> $Q/chain.sh <<'EOC'
cd /tmp/qrepo; Q=/tmp/qt
# the server's own /metrics, every 10 s, from whichever SGLang server qtune has up
python3 - > $Q/scrape.log 2>&1 <<'EOS' &
import time, urllib.request, psutil
while True:
    for p in psutil.process_iter(["cmdline"]):
        c = p.info["cmdline"] or []
        if "sglang.launch_server" in c and "--port" in c:
            port = c[c.index("--port") + 1]
            try:
                txt = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3).read()
                open(f"/tmp/qt/metrics-{port}.txt", "wb").write(txt)
            except Exception as e:
                print(port, e)
    time.sleep(10)
EOS
SCRAPER=$!
s=$(date +%s)
python3 -m qtune search --engine sglang --model examples/qwen3-4b --input-len 1024 --output-len 256 \
  --rate 40 --requests 800 --warmup 160 --seed 1 $SEARCH_ARGS --confirm-top 0 \
  --storage journal:///tmp/qt/h200-sglang.log --study h200-sglang-qwen3-4b --out $Q/h200-sglang.yaml \
  --json > $Q/search.json 2> $Q/search.err
echo "search rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
for f in systemd compose kubernetes; do
  python3 -m qtune emit $Q/h200-sglang.yaml --format $f -o $Q/emit-$f > $Q/emit-$f.out 2>&1
  echo "emit $f rc=$?" >> $Q/chain.log
done
s=$(date +%s)
if [ "$VERIFY_REPEAT" != 0 ]; then
  python3 -m qtune verify $Q/h200-sglang.yaml --repeat $VERIFY_REPEAT --json > $Q/verify.json 2> $Q/verify.err
  echo "verify rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
fi
kill $SCRAPER
touch $Q/DONE
EOC
  start_chain
  ;;
esac
wait_chain
for f in probe.json probe.txt h200-sglang.yaml search.json verify.json; do
  [ -f $Q/$f ] && cp $Q/$f $OUT/; done
cat $Q/probe.err $Q/search.err $Q/emit-*.out $Q/verify.err $Q/chain.out 2>/dev/null > $OUT/console.txt
tar czf $OUT/logs.tgz -C /tmp/qrepo studies -C $Q . --exclude=./h200-sglang.yaml 2>/dev/null
tail -c 3000 $Q/search.err 2>/dev/null; tail -c 800 $Q/verify.err 2>/dev/null
