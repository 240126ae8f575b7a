#!/usr/bin/env python3
"""Start one server as qtune would launch it and keep it up until SIGTERM.

For device chains that run several benchmark scripts against ONE server (a
cold start on the H200 costs 100-230 s of a 30-minute session).  Once the
server answers, ``--info`` gets ``{"url", "model", "tokenizer", "startup_s",
"argv"}``; SIGTERM or SIGINT stops the server (and qtune's guard kills it if
this process dies).

    python benchmarks/serve.py --model examples/qwen3-4b --info /tmp/server.json &
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import launch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model folder (default: embedded)")
    ap.add_argument("--params", default="{}", help="launch params as JSON ({}: defaults)")
    ap.add_argument("--info", type=Path, required=True)
    ap.add_argument("--startup-timeout", type=float, default=900.0)
    a = ap.parse_args()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    work = Path(tempfile.mkdtemp(prefix="qtune-serve-"))
    server, spec, tok = launch(a.model, json.loads(a.params), work)
    print(f"server: {' '.join(spec.argv)}  log {work / 'server.log'}", flush=True)
    with server:
        startup = server.wait_ready(a.startup_timeout)
        a.info.write_text(json.dumps({"url": spec.base_url, "model": spec.served_model,
                                      "tokenizer": tok, "startup_s": startup,
                                      "argv": list(spec.argv)}))
        print(f"ready after {startup:.0f} s", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
