"""``--sampler gp`` models the trials that set params.  The engine defaults'
baseline sets none; Optuna's GPSampler models only the params every finished
trial has, so with the baseline in the study it modelled nothing and every
trial was drawn at random (the replay table's GP picks were random's)."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import FloatDistribution, IntDistribution

from qtune.search.space import make_sampler

pytest.importorskip("scipy", reason="--sampler gp needs scipy (the gp extra, which setup installs)")

SPACE = {"max_num_seqs": IntDistribution(4, 256, log=True),
         "gpu_memory_utilization": FloatDistribution(0.7, 0.95)}


def study_with_baseline(sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    study = optuna.create_study(sampler=sampler)
    study.add_trial(optuna.trial.create_trial(value=10.0))  # the defaults: no params
    for i, (seqs, mem) in enumerate([(8, 0.75), (64, 0.9), (16, 0.8), (128, 0.72),
                                      (32, 0.93)]):
        study.add_trial(optuna.trial.create_trial(
            params={"max_num_seqs": seqs, "gpu_memory_utilization": mem},
            distributions=SPACE, value=float(abs(seqs - 40) + i)))
    return study


def test_the_gp_models_the_searched_params_despite_the_baseline():
    sampler = make_sampler("gp", [], seed=0, trials=8)
    study = study_with_baseline(sampler)
    trial = study.ask()
    space = sampler.infer_relative_search_space(study, study._storage.get_trial(trial._trial_id))
    assert set(space) == set(SPACE)
    # sampled by the model (relative), not by the random fallback
    params = sampler.sample_relative(study, study._storage.get_trial(trial._trial_id), space)
    assert set(params) == set(SPACE)
    assert 4 <= params["max_num_seqs"] <= 256


def test_optuna_s_own_gp_sees_no_space_with_the_baseline_in_it():
    """What the wrapper is for: without it the modelled space is empty."""
    sampler = optuna.samplers.GPSampler(seed=0, n_startup_trials=3)
    study = study_with_baseline(sampler)
    trial = study.ask()
    assert sampler.infer_relative_search_space(
        study, study._storage.get_trial(trial._trial_id)) == {}
