SEARCH_ARGS='--trials 5 --time-budget 8'; VERIFY_REPEAT=2
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
