"""``qtune storage-proxy``: Optuna's gRPC storage proxy in front of a
fleet's database, so that many workers talk to one process (``--storage
grpc://host:port``) instead of each holding database connections.

The proxy holds the database URL and its password; its workers' URL holds
none, and nothing it prints shows the password.  It has no login of its
own: whoever reaches its port reads and writes every study in the
database, so it listens on loopback unless told otherwise.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import optuna

from qtune.errors import InputError, StudyError, mask_url, printable
from qtune.search import fleet, optuna_api
from qtune.search.storage import check_storage_url, open_storage

# gRPC's server threads: each serves one call at a time, and a worker's
# calls are short (a heartbeat, a trial's attribute, the trial list).
THREADS = 32


def serve(url: str, host: str, port: int, say: Callable[[str], None]) -> None:
    """Serve the storage at ``url`` on ``host:port`` until interrupted;
    ``say`` gets the one line that tells the workers' URL."""

    check_storage_url(url)
    if not fleet.is_fleet(url) or url.startswith("grpc://"):
        raise InputError(f"--storage {printable(mask_url(url))}: not a database "
                         "server's URL",
                         hint="the proxy fronts the fleet's PostgreSQL (or MySQL): "
                         "--storage postgresql://user:PASS@db.lan/qtune")
    if not 1 <= port <= 65535:
        raise InputError(f"--port {port}: not a TCP port", hint="pick 1 to 65535")
    # Optuna's cache in front of RDB storage: the proxy's own reads of
    # finished trials stay in memory (its docs ask for get_storage).
    storage = optuna.storages.get_storage(open_storage(url))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            server = optuna_api.grpc_server(storage, host, port, THREADS)
        except ImportError:
            raise StudyError("the storage proxy needs grpcio",
                             hint="pip install 'qtune[fleet]'") from None
        except RuntimeError:  # grpc: "Failed to bind to address ..."
            raise InputError(f"--host {printable(host)} --port {port}: cannot listen "
                             "there (the port is taken, or the address is not this "
                             "host's)", hint="pick another --port") from None
    server.start()
    try:
        say(f"storage proxy for {printable(mask_url(url))} on grpc://{printable(host)}:"
            f"{port}: give workers "
            f"--storage grpc://<this host>:{port}")
        server.wait_for_termination()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop(grace=2).wait()
    say("storage proxy stopped")
