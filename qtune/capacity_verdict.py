"""A capacity probe's verdict (``judge_load``): held, or failed and how.

A probe holds when the SLO is met, no request failed and the server kept
up.  A failure is ``hard`` (failed requests, a pile-up, an SLO broken, a
probe stopped once its failure was certain) or ``soft`` (only a
keeping-up signal, or a contaminated phase), which the search measures again
before it decides anything.

Apart from the search (``qtune.capacity``) because the rule stands on its
own: it says what "held" means whatever procedure chose the load, and
``qtune check`` judges its runs at a profile's capacity with it, with no
search at all.
"""

from __future__ import annotations

from typing import Any

from qtune.bench import falls_behind
from qtune.metrics import metric_value
from qtune.objectives import SLO


def judge_load(s: dict[str, Any], slos: list[SLO],
               offered: float | None) -> tuple[bool, str, str]:
    """Held or not, why, and the kind of verdict: ``ok``, ``hard`` (failed
    requests, a pile-up, an SLO broken, a probe stopped once its failure was
    certain), or ``soft`` (only a keeping-up signal, or a contaminated
    phase): a soft failure is the one a transient or the noise of one run can
    give, so it is measured again before it decides anything."""
    stopped = s.get("stopped_early")
    if stopped and stopped != "saturated":
        return False, f"stopped early, failure certain: {stopped}", "hard"
    if s.get("contaminated"):
        return False, f"not used: {s['contaminated']}", "soft"
    if s["completed"] == 0:
        return False, "no request completed", "hard"
    if s["failed"]:
        return False, f"{s['failed']} failed requests", "hard"
    if s.get("saturated"):
        return False, "saturated (requests piled up)", "hard"
    for slo in slos:
        v = metric_value(s, slo.metric)
        if slo.violation(v) > 0:
            return False, f"{slo.metric}={v:.1f} breaks {slo}", "hard"
    behind = falls_behind(s, offered)
    if behind is not None:
        return False, behind, "soft"
    return True, "SLO met, kept up", "ok"
