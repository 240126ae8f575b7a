"""A stand-in server for testing qtune.server (not an engine double: it
only answers readiness).  python -m tests.fakes.server PORT NAME [options]

  --ready-after S   answer /health 200 only after S seconds
  --exit-after S    exit with code 3 after S seconds (startup crash)
  --fatal-after S   print FATAL-ENGINE-ERROR after S seconds and hang
  --stubborn-child  spawn a grandchild that ignores SIGTERM and sleeps
  --idle            never serve; log IDLE-WAIT every 0.1 s (a hung start)
  --busy            never serve; log a progress line every 0.1 s (a slow one)
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time


def main() -> None:
    port, name, *opts = sys.argv[1:]
    t0 = time.monotonic()
    opt = {opts[i]: opts[i + 1] if i + 1 < len(opts) and not opts[i + 1].startswith("--")
           else "1" for i in range(len(opts)) if opts[i].startswith("--")}
    ready_after = float(opt.get("--ready-after", 0))
    # Leave a file in the temp dir, as engines do (sockets, rendezvous files),
    # and show what the runner gave us.
    tmp = tempfile.mkstemp(prefix="fake-server-")[1]
    print(f"tmp {tmp} probe={os.environ.get('QTUNE_TEST_PROBE')}", flush=True)
    if "--stubborn-child" in opt:
        subprocess.Popen([sys.executable, "-c",
                          "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
                          "print('child up', flush=True); time.sleep(600)"])
    if "--exit-after" in opt:
        time.sleep(float(opt["--exit-after"]))
        print("RuntimeError: startup failed for a test", flush=True)
        sys.exit(3)
    for flag, line in (("--idle", "IDLE-WAIT: no broadcast block"), ("--busy", "step")):
        if flag in opt:
            for i in range(6000):
                print(f"{line} {i}", flush=True)
                time.sleep(0.1)
    if "--fatal-after" in opt:
        time.sleep(float(opt["--fatal-after"]))
        print("FATAL-ENGINE-ERROR: could not start", flush=True)
        time.sleep(600)

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            if time.monotonic() - t0 < ready_after:
                self.send_response(503)
                self.end_headers()
                return
            if self.path == "/health":
                body = b""
            elif self.path == "/v1/models":
                body = json.dumps({"data": [{"id": name}]}).encode()
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", int(port)), H)
    signal.signal(signal.SIGTERM, lambda *a: threading.Thread(target=srv.shutdown).start())
    print("serving", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
