"""One home for the rule "a measured phase never reuses prompts" (issue 30):
every phase's seed comes from ``qtune.seeds``, one-to-one in (phase, index,
warm-up), and no module of qtune computes a seed of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qtune import seeds
from qtune.seeds import INDEX_SPAN, Phase

ROOT = Path(__file__).parent.parent

_runs = st.tuples(st.sampled_from(list(Phase)), st.integers(0, INDEX_SPAN - 1), st.booleans())


def _seed(base: int, run: tuple[Phase, int, bool]) -> int:
    phase, index, warm = run
    s = seeds.seed(base, phase, index)
    return seeds.warmup(s) if warm else s


@given(st.integers(0, 2**63), _runs, _runs)
def test_two_different_runs_never_share_a_seed(base, a, b):
    """Prompts are drawn from ``random.Random(seed)``: different seeds,
    different prompts; a warm-up's seed is no measured phase's."""
    assert (_seed(base, a) == _seed(base, b)) == (a == b)


@given(st.integers(0, 2**40), st.integers(0, 1000))
def test_the_first_run_keeps_the_users_seed(base, rep):
    """``--seed`` is the seed of a study's (or a bench's) first run, and a
    repeat's are the ones after it: what the docs promise."""
    assert seeds.seed(base, Phase.RUN) == base
    assert seeds.seed(base, Phase.RUN, rep) == base + rep


def test_a_negative_seed_is_refused():
    """``random.Random(-3)`` draws what ``random.Random(3)`` draws, so a
    negative base would meet a later phase's prompts."""
    from qtune.errors import InputError
    from qtune.load.workload import Workload

    with pytest.raises(InputError, match="--seed: -3 is negative"):
        Workload(input_len=8, output_len=8, rate=1.0, seed=-3)


@pytest.mark.parametrize("index", [-1, INDEX_SPAN])
def test_an_index_out_of_range_is_refused(index):
    with pytest.raises(ValueError, match="phase index"):
        seeds.seed(0, Phase.PROBE, index)


def _seed_arithmetic(tree: ast.AST) -> list[int]:
    """Lines that compute a seed by hand: a ``seed=`` keyword, or an
    assignment to a name ending in ``seed``, whose value is arithmetic on a
    seed."""
    out = []
    for node in ast.walk(tree):
        values: list[ast.expr] = []
        if isinstance(node, ast.keyword) and node.arg and node.arg.endswith("seed"):
            values.append(node.value)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id.endswith("seed") for t in node.targets):
            values.append(node.value)
        elif isinstance(node, ast.Call):
            values += [a for a in node.args if isinstance(a, ast.BinOp)]
        for v in values:
            if isinstance(v, ast.BinOp) and "seed" in ast.unparse(v):
                out.append(v.lineno)
    return sorted(out)


def test_no_module_computes_a_seed_of_its_own():
    """The nine offsets that used to sit where each phase started (+1, +rep,
    +1000, +7919 i, +104729 k, +1000003) live in ``qtune.seeds`` alone: a new
    phase that wrote its own would meet this test before it met a cache."""
    found = {}
    for path in sorted((ROOT / "qtune").rglob("*.py")):
        if path.name == "seeds.py":
            continue
        lines = _seed_arithmetic(ast.parse(path.read_text(), str(path)))
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert not found, f"seed arithmetic outside qtune/seeds.py: {found}"


def test_the_scan_sees_what_it_is_meant_to():
    code = ("w = replace(wl, seed=wl.seed + 1)\n"
            "seed = wl.seed + 104729 * k\n"
            "src = RequestSource(wl, tok, wl.seed + 1_000_003)\n"
            "ok = replace(wl, seed=seeds.seed(wl.seed, Phase.PROBE, k))\n")
    assert _seed_arithmetic(ast.parse(code)) == [1, 2, 3]
