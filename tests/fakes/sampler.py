"""A sampler that proposes exactly the points a test lists.

A test that needs a crashing config, a refused one and a fast one used to
find a seed whose random draws happened to give them; a new Optuna release
may draw differently (draws are not its API).  A script gives them by
construction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna
import pytest
from optuna.distributions import BaseDistribution, CategoricalDistribution


class ScriptedSampler(optuna.samplers.BaseSampler):
    """Each trial that samples anything takes the next point of the script
    (from the top again once it runs out); a parameter the point leaves out
    must have a single possible value (fixed by a space file)."""

    def __init__(self, points: Sequence[Mapping[str, Any]]) -> None:
        if not points:
            raise ValueError("a script needs at least one point")
        self._points = list(points)
        self._taken: dict[int, Mapping[str, Any]] = {}

    def infer_relative_search_space(self, study: Any, trial: Any
                                    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study: Any, trial: Any,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: Any, trial: Any, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        if trial.number not in self._taken:
            self._taken[trial.number] = self._points[len(self._taken) % len(self._points)]
        point = self._taken[trial.number]
        if param_name in point:
            return point[param_name]
        d = param_distribution
        if isinstance(d, CategoricalDistribution) and len(d.choices) == 1:
            return d.choices[0]
        if getattr(d, "low", None) is not None and d.low == getattr(d, "high", None):
            return d.low
        raise KeyError(f"the script's point {dict(point)} has no {param_name!r}")


def script_random_sampler(monkeypatch: pytest.MonkeyPatch,
                          points: Sequence[Mapping[str, Any]]) -> None:
    """Make ``sampler="random"`` propose ``points`` in order.  qtune builds
    its samplers by name from ``optuna.samplers`` when a study starts or
    resumes, so the script stands in wherever the search builds it (and
    starts from the top on a resume)."""
    monkeypatch.setattr(optuna.samplers, "RandomSampler",
                        lambda seed=None, **kw: ScriptedSampler(points))
