"""vLLM CPU build: which thread bindings, reserved CPUs and allocators this
host can run, each with the reason it is worth a trial.

What the installed vLLM 0.32 CPU build reads (``vllm/envs.py``,
``vllm/utils/ompmultiprocessing.py``, ``vllm/platforms/cpu.py``,
``vllm/v1/worker/cpu_worker.py``):

- ``VLLM_CPU_OMP_THREADS_BIND``: ``auto`` (default) puts local rank *i* on
  the *i*-th NUMA node the process may use, one OpenMP thread per physical
  core (the last SMT sibling on x86), and asserts that there are at least as
  many nodes as ranks; ``nobind`` leaves the threads to the kernel; anything
  else is one CPU list per rank, ranks separated by ``|`` (``0-31|32-63``).
- ``VLLM_CPU_NUM_OF_RESERVED_CPU``: cores ``auto`` keeps off the OpenMP
  threads for the API server and scheduler (default: one per rank on x86,
  taken from the last rank's cores first).  Explicit lists and ``nobind``
  ignore it.
- ``LD_PRELOAD``: vLLM warns at start unless ``libtcmalloc`` is preloaded and
  adds its own bundled tcmalloc (``vllm/libs``) when the wheel has one, and
  PyTorch's libgomp when no OpenMP runtime is preloaded.  The CPU
  installation docs ask for tcmalloc in ``LD_PRELOAD``; jemalloc is not named
  by vLLM, and a bundled tcmalloc would be put in front of it (the first
  preloaded allocator wins), so jemalloc is offered only without one (the
  host's allocators: ``qtune.host.allocators``).
"""

from __future__ import annotations

from dataclasses import dataclass

from qtune.host.sysfs import format_cpulist, parse_cpulist

__all__ = ["BindChoice", "auto_reserve", "bind_choices", "bind_cpus",
           "fewest_cores", "rank_nodes", "reserve_choices"]

@dataclass(frozen=True)
class BindChoice:
    value: str
    why: str


def rank_nodes(nodes: list[tuple[int, list[int]]], usable: list[int],
               ranks: int) -> list[tuple[int, list[int]]] | None:
    """The NUMA nodes ``auto`` gives ranks 0..ranks-1 (node id, its usable
    CPUs), or None when there are fewer usable nodes than ranks."""
    ok = set(usable)
    have = [(nid, [c for c in cpus if c in ok]) for nid, cpus in nodes]
    have = [(nid, cpus) for nid, cpus in have if cpus]
    return have[:ranks] if ranks <= len(have) else None


def auto_reserve(ranks: int) -> int:
    """vLLM's own reserve on x86 and Arm: one core per rank."""
    return ranks


def bind_choices(nodes: list[tuple[int, list[int]]], usable: list[int],
                 cores: list[list[int]], ranks: int) -> list[BindChoice]:
    """Values of VLLM_CPU_OMP_THREADS_BIND valid on this topology for
    ``ranks`` local ranks (tensor x pipeline parallel)."""
    out = []
    per_rank = rank_nodes(nodes, usable, ranks)
    if per_rank is not None:
        out.append(BindChoice(
            "auto", "vLLM's default: one thread per physical core of "
            + ("the first NUMA node" if ranks == 1 else f"NUMA nodes 0-{ranks - 1}, "
               "one rank each") + ", reserved cores excepted"))
    out.append(BindChoice(
        "nobind", "threads not pinned: the kernel may move them, which can help "
        "when the API server or other work shares the cores"))
    smt = any(len(c) > 1 for c in cores)
    if per_rank is not None and smt:
        lists = [format_cpulist(cpus) for _, cpus in per_rank]
        out.append(BindChoice(
            "|".join(lists), "every SMT sibling as an OpenMP thread (auto uses one "
            "per core): memory-bound decoding may gain, compute-bound prefill lose"))
    return out


def fewest_cores(nodes: list[tuple[int, list[int]]], usable: list[int],
                 cores: list[list[int]], ranks: int) -> int:
    """Physical cores of the smallest rank under ``auto`` (0: cannot run)."""
    per_rank = rank_nodes(nodes, usable, ranks)
    if per_rank is None:
        return 0
    core_of = {c: i for i, group in enumerate(cores) for c in group}
    return min(len({core_of.get(c, -1 - c) for c in cpus}) for _, cpus in per_rank)


def reserve_choices(nodes: list[tuple[int, list[int]]], usable: list[int],
                    cores: list[list[int]], ranks: int) -> tuple[int, ...]:
    """VLLM_CPU_NUM_OF_RESERVED_CPU values that leave each rank at least one
    core under ``auto``: none, vLLM's default, and twice it on a larger host."""
    fewest = fewest_cores(nodes, usable, cores, ranks)
    base = auto_reserve(ranks)
    # vLLM takes them from the last ranks first, at most ceil(r / ranks) each.
    return tuple(r for r in (0, base, 2 * base) if -(-r // ranks) < fewest)


def bind_cpus(value: str) -> list[list[int]] | None:
    """The CPUs per rank of an explicit binding, None for ``auto``/``nobind``
    (vLLM chooses, or nothing is pinned).  Raises ValueError on a malformed
    list."""
    if value in ("auto", "nobind"):
        return None
    ranks = value.split("|")
    out = []
    for r in ranks:
        if not r or not all(ch.isdigit() or ch in ",-" for ch in r):
            raise ValueError(f"not a CPU list: {r!r}")
        cpus = parse_cpulist(r)
        if not cpus:
            raise ValueError(f"not a CPU list: {r!r}")
        out.append(cpus)
    return out
