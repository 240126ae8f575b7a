"""SGLang's own benchmark client against the profile and the engine defaults, each on a
fresh start (run 10 of RESULTS.md).  Run on the device after sglang_run.sh, from /tmp/qt:

    PYTHONPATH=/tmp/site python3 <repo>/benchmarks/gpu-h200/recipes/sglang_client_check.py

The client imports HF datasets at module level; its random-ids dataset never calls it, so
sglang_client_stub/ stands in for it (datasets is not installed on the device).  The
defaults' command is the profile's up to its --port (the tuned flags come after it).
Each server runs under qtune's guard (qtune.server.Server), as qtune's own do."""

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engines_crosscheck import sglang_client  # noqa: E402

from qtune.launch import LaunchSpec  # noqa: E402  (engines_crosscheck put the repo on the path)
from qtune.server import Server  # noqa: E402

QT = Path("/tmp/qt")


def main() -> None:
    p = yaml.safe_load((QT / "h200-sglang.yaml").read_text())
    argv = list(p["argv"])
    port = int(argv[argv.index("--port") + 1])
    tok = argv[argv.index("--tokenizer-path" if "--tokenizer-path" in argv else "--model") + 1]
    name = argv[argv.index("--served-model-name") + 1]
    # the repo too: the server runs under qtune's guard (python -m qtune.guard)
    repo = str(Path(__file__).resolve().parents[3])
    env = {**(p.get("env") or {}), "HF_HUB_OFFLINE": "1", "PYTHONPATH": f"/tmp/site:{repo}"}
    configs = {"profile": argv, "defaults": argv[:argv.index("--port") + 2]}
    for i, (label, command) in enumerate(configs.items()):
        spec = LaunchSpec(argv=tuple(command), env=env, host="127.0.0.1", port=port,
                          served_model=name)
        with Server(spec, QT / f"x-{label}.log") as srv:
            print(label, "ready", round(srv.wait_ready(900)), "s", flush=True)
            sglang_client(sys.executable, spec.base_url, name, tok, 1024, 256, 40, 800,
                          11 + i, QT / f"x-{label}.jsonl", QT / f"x-{label}-bench.txt",
                          pythonpath="/tmp/site")
        keys = ("Request throughput", "P99 E2E", "Median TTFT", "P99 TTFT", "Median TPOT",
                "Successful", "Total input")
        out = (QT / f"x-{label}-bench.txt").read_text()
        print("\n".join(line for line in out.splitlines() if any(k in line for k in keys)),
              flush=True)


if __name__ == "__main__":
    main()
