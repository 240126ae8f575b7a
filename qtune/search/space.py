"""The search space as Optuna sees it: distributions, samplers, grids."""

from __future__ import annotations

import math
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from qtune.engines.base import Param
from qtune.errors import InputError


def _tidy(params: dict[str, Any], dists: dict[str, BaseDistribution]) -> dict[str, Any]:
    """Stepped floats come back as 0.7899999999999999: round them to their
    step, so the engine, the profile and the unit see 0.79."""
    out = dict(params)
    for k, v in params.items():
        d = dists.get(k)
        if isinstance(d, FloatDistribution) and d.step:
            digits = max(0, -math.floor(math.log10(d.step)) + 1)
            out[k] = round(v, digits)
    return out


def distributions(params: list[Param]) -> dict[str, BaseDistribution]:
    out: dict[str, BaseDistribution] = {}
    for p in params:
        if p.kind == "int":
            out[p.name] = IntDistribution(int(p.low), int(p.high), log=p.log)  # type: ignore[arg-type]
        elif p.kind == "float":
            out[p.name] = FloatDistribution(
                float(p.low), float(p.high), log=p.log,  # type: ignore[arg-type]
                step=None if p.log else p.step,
            )
        elif p.kind == "bool":
            out[p.name] = CategoricalDistribution((False, True))
        else:
            out[p.name] = CategoricalDistribution(p.choices)
    return out


SAMPLERS = ("tpe", "gp", "random", "grid", "nsga2")


def make_sampler(
    name: str, params: list[Param], seed: int, trials: int
) -> optuna.samplers.BaseSampler:
    """TPE by default (Optuna 5: multivariate, constant liar).  Few random
    start-up trials: every trial costs a server start."""
    startup = min(5, max(trials // 3, 1))
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)
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
                             hint="pip install scipy torch, or use --sampler tpe") from None
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)
    if name == "grid":
        return optuna.samplers.GridSampler(grid_values(params), seed=seed)
    raise InputError(f"--sampler: unknown sampler {name!r}",
                     hint="choose one of " + ", ".join(SAMPLERS))


def grid_values(params: list[Param]) -> dict[str, list[Any]]:
    """A grid over the space: choices as they are, booleans both ways,
    numeric ranges by powers of two (log) or five even steps."""
    grid: dict[str, list[Any]] = {}
    for p in params:
        if p.kind == "bool":
            grid[p.name] = [False, True]
        elif p.kind == "choice":
            grid[p.name] = list(p.choices)
        elif p.kind == "int" and p.log:
            vals, v = [], 1
            while v <= p.high:  # type: ignore[operator]
                if v >= p.low:  # type: ignore[operator]
                    vals.append(v)
                v *= 2
            grid[p.name] = vals or [int(p.low)]  # type: ignore[arg-type]
        else:
            lo, hi = float(p.low), float(p.high)  # type: ignore[arg-type]
            vals_f = [lo + (hi - lo) * i / 4 for i in range(5)]
            grid[p.name] = sorted({int(round(v)) if p.kind == "int" else round(v, 3)
                                   for v in vals_f})
    return grid


def _describe(p: Param) -> str:
    if p.kind in ("int", "float"):
        return f"{p.low:g}..{p.high:g}" + (" (log)" if p.log else "")
    if p.kind == "bool":
        return "on/off"
    return "|".join(map(str, p.choices))
