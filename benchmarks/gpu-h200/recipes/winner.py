#!/usr/bin/env python3
"""For capacity_run.sh's STUDY chain: the winner of a capacity study, as shell
assignments PARAMS (its launch params as JSON, for benchmarks/serve.py), RATE
(the capacity the profile reports) and N (twice the longest probe of that
trial, the cross-check's length per client, as issue 13 asks).

    winner.py PROFILE.yaml JOURNAL.log > winner.env
"""

from __future__ import annotations

import json
import shlex
import sys

import optuna
import yaml
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend


def main() -> int:
    prof = yaml.safe_load(open(sys.argv[1]))
    params = prof.get("params") or {}
    rate = float(prof["metrics"]["objective"]["best"])
    storage = JournalStorage(JournalFileBackend(sys.argv[2]))
    study = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0],
                              storage=storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    # The profile's trial: the same launch params (the baseline's are {}).
    match = [t for t in done if (t.user_attrs.get("launch_params") or {}) == params]
    trial = match[0] if match else max(done, key=lambda t: t.value or 0.0)
    steps = ((trial.user_attrs.get("summary") or {}).get("capacity") or {}).get("steps") or []
    n = 2 * max((int(s["requests"]) for s in steps), default=int(rate * 60))
    print(f"PARAMS={shlex.quote(json.dumps(params))}")
    print(f"RATE={rate:g}")
    print(f"N={n}")
    print(f"# trial {trial.number}, {'matched' if match else 'best value'}; "
          f"{len(steps)} probes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
