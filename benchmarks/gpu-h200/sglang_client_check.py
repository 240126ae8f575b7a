"""SGLang's own benchmark client against the profile and the engine defaults, each on a
fresh start (run 10 of RESULTS.md).  Run on the device after sglang_run.sh, from /tmp/qt:

    PYTHONPATH=/tmp/site python3 <repo>/benchmarks/gpu-h200/sglang_client_check.py

The client imports HF datasets at module level; its random-ids dataset never calls it, so
sglang_client_stub/ stands in for it (datasets is not installed on the device).  The
defaults' command is the profile's up to its --port (the tuned flags come after it)."""

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

QT = Path("/tmp/qt")
STUB = Path(__file__).resolve().parent / "sglang_client_stub"


def main() -> None:
    p = yaml.safe_load((QT / "h200-sglang.yaml").read_text())
    argv = list(p["argv"])
    port = argv[argv.index("--port") + 1]
    tok = argv[argv.index("--tokenizer-path" if "--tokenizer-path" in argv else "--model") + 1]
    name = argv[argv.index("--served-model-name") + 1]
    env = {**os.environ, **(p.get("env") or {}), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": "/tmp/site"}
    client_env = dict(env, PYTHONPATH=f"/tmp/site:{STUB}")
    configs = {"profile": argv, "defaults": argv[:argv.index("--port") + 2]}
    for i, (label, command) in enumerate(configs.items()):
        t = time.time()
        with open(QT / f"x-{label}.log", "w") as log:
            srv = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(2)
        print(label, "ready", round(time.time() - t), "s", flush=True)
        r = subprocess.run(
            [sys.executable, "-m", "sglang.benchmark.serving", "--backend", "sglang-oai",
             "--base-url", f"http://127.0.0.1:{port}", "--model", name, "--tokenizer", tok,
             "--dataset-name", "random-ids", "--random-input-len", "1024",
             "--random-output-len", "256", "--random-range-ratio", "1.0",
             "--num-prompts", "800", "--request-rate", "40", "--seed", str(11 + i),
             "--output-file", str(QT / f"x-{label}.jsonl")],
            env=client_env, capture_output=True, text=True)
        (QT / f"x-{label}-bench.txt").write_text(r.stdout + r.stderr)
        keys = ("Request throughput", "P99 E2E", "Median TTFT", "P99 TTFT", "Median TPOT",
                "Successful", "Total input")
        print("\n".join(line for line in r.stdout.splitlines() if any(k in line for k in keys)),
              flush=True)
        os.killpg(srv.pid, 9)
        srv.wait()
        time.sleep(5)


if __name__ == "__main__":
    main()
