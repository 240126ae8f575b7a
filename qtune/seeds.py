"""Where every measured phase gets its prompts: one seed per phase, handed
out here and nowhere else.

The rule: a measured phase never sends a prompt an earlier phase on the same
server sent, unless the workload asks for shared prefixes.  The phases on one
server derive from the seed of the run that started it (a trial's base, a
confirmation round's), so the rule holds per server: the same prompts on two
fresh servers meet no cache.  The prompts of a
phase are drawn from ``random.Random(seed)`` (``qtune.load.workload``), so
two phases with different seeds send different prompts, and two with the same
seed send the same ones.  A phase's seed is the workload's (``--seed``, the
*base*) plus an offset that names what the phase is for (``Phase``) and its
index (the probe, the repeat, the level), and its warm-up draws from a seed
of its own beside it (``warmup``).  The map from (phase, index, warm-up) to
the offset is one-to-one, so within one base no two phases share prompts by
accident (a nested phase, a probe inside a confirmation round, may meet
another base's phase, but never on the same server); the phases that must
see the same prompts say so by asking for the same phase and index (``qtune
verify``'s sides in a round).

Before this module the offsets were written where each phase started (9
sites, 6 strides: +1, +rep, +1000, +7919 i, +104729 k, +1000003): that no two
met was true, and nowhere a rule.
"""

from __future__ import annotations

from enum import IntEnum

# An index (a probe, a repeat, a level) below this; a phase's offsets are
# this far apart, and the warm-up's are beyond every phase's.
INDEX_SPAN = 1 << 32
_WARMUP = 1 << 48


class Phase(IntEnum):
    """What a measured phase is for: its share of the seed's offsets."""

    RUN = 0  # a trial's (or a bench's) run at the study's load; index: the repeat
    PROBE = 1  # a capacity search's probe on one server; index: the probe's number
    FIRST_LOAD = 2  # a capacity trial that found nothing: one run at the study's load
    LEVEL = 3  # --levels: a lower level on the trial's server; index: its rank
    CONFIRM = 4  # the confirmation's fresh starts; index: the round
    SPECULATIVE = 5  # the speculative A/B rounds; index: the round
    VERIFY = 6  # qtune verify's rounds, the same on every side; index: the round
    CHECK = 7  # qtune check's runs against a deployed server; index: the run


def seed(base: int, phase: Phase, index: int = 0) -> int:
    """The seed of the measured prompts of ``phase``'s ``index``-th run."""
    if not 0 <= index < INDEX_SPAN:
        raise ValueError(f"a phase index is 0..{INDEX_SPAN - 1}, not {index}")
    return base + int(phase) * INDEX_SPAN + index


def warmup(measured: int) -> int:
    """The seed of the warm-up prompts of the phase measured with ``measured``:
    beside every phase's measured seeds, never one of them."""
    return measured + _WARMUP
