"""The search space as Optuna sees it: distributions, samplers, grids."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, cast

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from qtune.engines.base import Param
from qtune.errors import InputError
from qtune.params import Params, ParamScalar


def tidy(values: Params, params: list[Param]) -> Params:
    """The values to launch with.  Stepped floats come back as
    0.7899999999999999: round them to their step, so the engine, the profile
    and the unit see 0.79.  ``pow2`` ints go to the nearest power of two in
    range (in log space, so the sampler's model stays monotone)."""
    out = dict(values)
    by_name = {p.name: p for p in params}
    for k, v in values.items():
        p = by_name.get(k)
        if p is None:
            continue
        num = cast(float, v)  # the value of an int or float param (used only so)
        if p.kind == "float" and p.step and not p.log:
            digits = max(0, -math.floor(math.log10(p.step)) + 1)
            out[k] = round(num, digits)
        elif p.kind == "int" and p.pow2 and num > 0:
            powers = [2**e for e in range(0, 31)
                      if p.bounds[0] <= 2**e <= p.bounds[1]]
            if powers:
                out[k] = min(powers, key=lambda c: abs(math.log2(c) - math.log2(num)))
    return out


def initial_design(params: list[Param], n: int, seed: int,
                   valid: Callable[[Params], bool] | None = None,
                   tries: int = 200) -> list[Params]:
    """``n`` start points as a Latin hypercube: each parameter's range is cut
    into ``n`` strata and every stratum is used once, so with two points an
    on/off parameter is tried both ways and a range at both ends.  Random
    start-up points can leave a whole half of a dimension untried, which
    matters when every trial is a server start.  Designs with a point that
    ``valid`` refuses are drawn again."""
    import random

    rng = random.Random(seed)
    design: list[Params] = []
    for _ in range(tries):
        strata = {p.name: rng.sample(range(n), n) for p in params}
        design = []
        for i in range(n):
            point: Params = {}
            for p in params:
                u = (strata[p.name][i] + rng.random()) / n
                point[p.name] = _at(p, u)
            design.append(point)
        if valid is None or all(valid(pt) for pt in design):
            return design
    return design  # no fully valid design: refusals are cheap, use the last


def _at(p: Param, u: float) -> Any:
    """The value at quantile ``u`` of a parameter's range, as sampled."""
    if p.kind == "bool":
        return u >= 0.5
    if p.kind == "choice":
        return p.choices[min(int(u * len(p.choices)), len(p.choices) - 1)]
    lo, hi = (float(b) for b in p.bounds)
    v = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))) if p.log \
        else lo + u * (hi - lo)
    if p.kind == "int":
        return min(int(hi), max(int(lo), int(round(v))))
    if p.step and not p.log:
        v = lo + round((v - lo) / p.step) * p.step
        v = round(v, max(0, -math.floor(math.log10(p.step)) + 1))
    return min(hi, max(lo, v))


def distributions(params: list[Param]) -> dict[str, BaseDistribution]:
    out: dict[str, BaseDistribution] = {}
    for p in params:
        if p.kind == "int":
            out[p.name] = IntDistribution(int(p.bounds[0]), int(p.bounds[1]), log=p.log)
        elif p.kind == "float":
            out[p.name] = FloatDistribution(
                float(p.bounds[0]), float(p.bounds[1]), log=p.log,
                step=None if p.log else p.step,
            )
        elif p.kind == "bool":
            out[p.name] = CategoricalDistribution((False, True))
        else:
            out[p.name] = CategoricalDistribution(p.choices)
    return out


SAMPLERS = ("tpe", "gp", "random", "grid", "nsga2")


def startup_trials(trials: int) -> int:
    """Trials before the model-based samplers use their model: few, since
    each one is a server start."""
    return min(5, max(trials // 3, 1))


def make_sampler(
    name: str, params: list[Param], seed: int, trials: int
) -> optuna.samplers.BaseSampler:
    """TPE by default (Optuna 5: multivariate, constant liar).  Few random
    start-up trials: every trial costs a server start."""
    startup = startup_trials(trials)
    if name == "tpe":
        # group=True: the baseline trial has no parameters, which would
        # empty the joint space multivariate TPE models (all independent).
        with warnings.catch_warnings():  # "experimental" since Optuna 2.8
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup,
                                              multivariate=True, group=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, startup))
    if name == "gp":
        try:
            import scipy  # noqa: F401
            import torch  # noqa: F401
        except ImportError:
            raise InputError("--sampler gp needs scipy and torch",
                             hint="pip install 'qtune[gp]' (and torch), "
                             "or use --sampler tpe") from None
        return _GP(seed=seed, n_startup_trials=startup)
    if name == "grid":
        return _Grid(grid_values(params), seed=seed)
    raise InputError(f"--sampler: unknown sampler {name!r}",
                     hint="choose one of " + ", ".join(SAMPLERS))


class _WithParams:
    """The study as GPSampler should see it: without the finished trials that
    have no params (the engine defaults' baseline, which sets no flag).
    GPSampler models the params every finished trial shares; with the
    baseline among them that is none, and every trial fell back to random
    sampling (the replay table showed GP no better than random)."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, *args: Any, **kwargs: Any) -> list[optuna.trial.FrozenTrial]:
        return [t for t in self._study._get_trials(*args, **kwargs)
                if t.params or not t.state.is_finished()]


class _GP(optuna.samplers.GPSampler):
    """Optuna's GPSampler over the trials that set params (``_WithParams``)."""

    def infer_relative_search_space(
            self, study: optuna.Study, trial: optuna.trial.FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return super().infer_relative_search_space(_WithParams(study), trial)  # type: ignore[arg-type]

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> Params:
        return super().sample_relative(_WithParams(study), trial,  # type: ignore[arg-type]
                                       search_space)


class _Grid(optuna.samplers.GridSampler):
    """Optuna's grid sampler calls ``study.stop()`` once every point has
    been tried, which raises outside ``Study.optimize``; qtune drives
    ask/tell and checks ``is_exhausted`` itself before each ask."""

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                    state: optuna.trial.TrialState, values: Sequence[float] | None) -> None:
        pass


def grid_values(params: list[Param]) -> dict[str, Sequence[ParamScalar]]:
    """A grid over the space: choices as they are, booleans both ways,
    numeric ranges by powers of two (log) or five even steps."""
    grid: dict[str, Sequence[ParamScalar]] = {}
    for p in params:
        if p.kind == "bool":
            grid[p.name] = [False, True]
        elif p.kind == "choice":
            grid[p.name] = list(p.choices)
        elif p.kind == "int" and p.log:
            vals, v = [], 1
            while v <= p.bounds[1]:
                if v >= p.bounds[0]:
                    vals.append(v)
                v *= 2
            grid[p.name] = vals or [int(p.bounds[0])]
        else:
            lo, hi = (float(b) for b in p.bounds)
            vals_f = [lo + (hi - lo) * i / 4 for i in range(5)]
            grid[p.name] = sorted({int(round(v)) if p.kind == "int" else round(v, 3)
                                   for v in vals_f})
    return grid


def describe(p: Param) -> str:
    if p.kind in ("int", "float"):
        return f"{p.low:g}..{p.high:g}" + (" (log)" if p.log else "")
    if p.kind == "bool":
        return "on/off"
    return "|".join(map(str, p.choices))
