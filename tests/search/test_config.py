from __future__ import annotations

import re

import pytest

from qtune.engines.base import Param
from qtune.errors import InputError
from qtune.search.config import (
    SpaceOverride,
    apply_overrides,
    load_space_file,
)

PARAMS = [
    Param("max_num_seqs", "int", low=4, high=256, log=True),
    Param("enable_prefix_caching", "bool"),
    Param("kv_cache_dtype", "choice", choices=("auto", "fp8")),
]


def test_overrides_fix_range_and_choices():
    params, fixed = apply_overrides(PARAMS, SpaceOverride({
        "max_num_seqs": {"low": 8, "high": 64},
        "enable_prefix_caching": False,
        "kv_cache_dtype": ["auto"],
    }, "s.yaml"))
    by = {p.name: p for p in params}
    seqs = by["max_num_seqs"]
    assert (seqs.low, seqs.high, seqs.log) == (8, 64, True)
    assert fixed == {"enable_prefix_caching": False}
    assert by["kv_cache_dtype"].choices == ("auto",)


@pytest.mark.parametrize(
    ("entries", "needle"),
    [
        ({"max_num_seq": 4}, "max_num_seqs"),  # nearest name in the hint
        ({"max_num_seqs": "many"}, "integer"),
        ({"max_num_seqs": {"low": 64, "high": 8}}, None),
        ({"max_num_seqs": {"lo": 1}}, "lo"),
        ({"kv_cache_dtype": ["fp16"]}, "auto"),
        ({"enable_prefix_caching": {"low": 0}}, None),
        ({"max_num_seqs": []}, None),
    ],
)
def test_overrides_reject(entries, needle):
    with pytest.raises(InputError) as e:
        apply_overrides(PARAMS, SpaceOverride(entries, "s.yaml"))
    text = e.value.message + (e.value.hint or "")
    assert "s.yaml" in text
    if needle:
        assert needle in text


def test_space_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_num_seqs: [1, 2\n")
    with pytest.raises(InputError, match="line"):
        load_space_file(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- a\n- b\n")
    with pytest.raises(InputError, match="mapping"):
        load_space_file(lst)
    with pytest.raises(InputError, match="cannot read"):
        load_space_file(tmp_path / "missing.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_space_file(empty).entries == {}


def test_grid_values_cover_the_space():
    from qtune.search import grid_values

    g = grid_values(PARAMS + [Param("gpu_memory_utilization", "float", low=0.7, high=0.9)])
    assert g["max_num_seqs"] == [4, 8, 16, 32, 64, 128, 256]
    assert g["enable_prefix_caching"] == [False, True]
    assert g["kv_cache_dtype"] == ["auto", "fp8"]
    assert g["gpu_memory_utilization"] == [0.7, 0.75, 0.8, 0.85, 0.9]


def test_unknown_sampler():
    from qtune.search import make_sampler

    with pytest.raises(InputError, match="sampler"):
        make_sampler("cmaes", PARAMS, 0, 10)
    assert make_sampler("grid", PARAMS, 0, 10) is not None


def test_initial_design_is_a_latin_hypercube():
    from qtune.search.space import initial_design

    params = [Param("seqs", "int", low=4, high=512, log=True),
              Param("fp8", "bool"),
              Param("util", "float", low=0.7, high=0.95, step=0.01),
              Param("size", "choice", choices=(64, 128, 256, 512))]
    for seed in range(20):
        two = initial_design(params, 2, seed)
        assert {p["fp8"] for p in two} == {False, True}  # both ways, always
        assert sorted(p["seqs"] < 45 for p in two) == [False, True]  # both halves
        four = initial_design(params, 4, seed)
        assert sorted(p["size"] for p in four) == [64, 128, 256, 512]
        assert all(0.7 <= p["util"] <= 0.95 and round(p["util"], 2) == p["util"]
                   for p in four)
    # Designs with a refused point are drawn again.
    ok = initial_design(params, 2, 0, valid=lambda pt: pt["seqs"] >= 8)
    assert all(p["seqs"] >= 8 for p in ok)


@pytest.mark.parametrize("name", ["s", "qwen3-4b.v2_x", "a" * 120])
def test_study_name_accepts(name):
    from qtune.search.config import check_study_name

    assert check_study_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", ".x", "a..b", "a/b", "../x", "/abs",
                                  "a\\b", "a b", "a\nb", "a" * 121, "é"])
def test_study_name_refuses(name):
    from qtune.errors import StudyError
    from qtune.search.config import check_study_name

    with pytest.raises(StudyError, match="not a study name") as e:
        check_study_name(name)
    assert "\n" not in e.value.message


@pytest.mark.parametrize(("text", "needle"), [
    ("max_num_seqs: {low: 0, high: 8, log: true}\n", "log range needs low > 0"),
    ("max_num_seqs: {low: -1, high: 8, log: true}\n", "log range"),
    ("max_num_seqs: {low: .inf, high: 8}\n", "finite"),
    ("max_num_seqs: {low: 1, high: 8, step: -1}\n", "step must be positive"),
    ("max_num_seqs: {low: 1, high: 8, log: yes please}\n", "log must be"),
    ("max_num_seqs: {low: 1, high: 8, log: true, step: 2}\n", "log or step"),
    ("max_num_seqs: {low: 9, high: 8}\n", "low 9 > high 8"),
    ("max_num_seqs: {low: [1], high: 8}\n", "finite number"),
    ("max_num_seqs: []\n", "empty list"),
    ("max_num_seqs: [1, [2]]\n", "a value must be"),
    ("max_num_seqs:\n", "a value must be"),
    ("1: 8\n", "names are strings"),
])
def test_space_file_checked_on_load(tmp_path, text, needle):
    """Without the engine: a bad space file fails before any probe."""
    (tmp_path / "s.yaml").write_text(text)
    with pytest.raises(InputError, match=re.escape(needle)):
        load_space_file(tmp_path / "s.yaml")


def test_space_override_log_range_over_engine_default(cpu_ctx):
    """A log range from the engine (max_num_seqs is log) cannot get low 0."""
    from qtune.engines import get_engine

    params = get_engine("vllm").space(cpu_ctx)
    name = next(p.name for p in params if p.log)
    with pytest.raises(InputError, match="log range"):
        apply_overrides(params, SpaceOverride({name: {"low": 0}}, "s.yaml"))


@pytest.mark.parametrize("text", ["nan,2", "2,inf", "-inf,2"])
def test_levels_must_be_finite(text):
    from qtune.search.config import parse_levels

    with pytest.raises(InputError, match="finite"):
        parse_levels(text)


@pytest.mark.parametrize(("url", "needle"), [
    ("http://h:80x", "bad port"), ("http://h:99999", "bad port"), ("http://h:0", "bad port"),
    ("ftp://h/", "http(s)"), ("h:8000", "http(s)"), ("http://", "http(s)"),
    ("http://[::1", "cannot parse"), ("http://h\n:80/", "control"),
])
def test_check_url(url, needle):
    from qtune.bench import check_url

    with pytest.raises(InputError, match=re.escape(needle)):
        check_url(url)
    with pytest.raises(InputError) as e:
        check_url(url.replace("//", "//u:pw123456@", 1))
    assert "pw123456" not in e.value.message


def test_check_url_accepts():
    from qtune.bench import check_url

    for u in ("http://127.0.0.1:8000", "https://h/v1", "http://u:p@h:1", "http://[::1]:8"):
        assert check_url(u) == u


def test_check_config_ranges():
    from qtune.options import grouped
    from qtune.search.config import TuneConfig, check_config

    for bad, needle in [({"seed": -1}, "--seed"), ({"seed": 2**32}, "--seed"),
                        ({"startup_timeout": float("nan")}, "--startup-timeout"),
                        ({"startup_timeout": 0}, "--startup-timeout"),
                        ({"time_budget": float("inf")}, "--time-budget"),
                        ({"max_model_len": 0}, "--max-model-len"),
                        ({"pick": -1}, "--pick"),
                        # the option groups' own checks, reached through the config
                        ({"capacity_tolerance": 0.001}, "--capacity-tolerance"),
                        ({"capacity_window": float("nan")}, "--capacity-window"),
                        ({"max_quality_loss": -0.1}, "--max-quality-loss"),
                        ({"exact": True, "lossy": True}, "--exact and --lossy"),
                        ({"finish": True}, "--finish needs --study")]:
        with pytest.raises(InputError, match=needle):
            check_config(TuneConfig(**grouped(bad)))
    check_config(TuneConfig(seed=2**32 - 1, time_budget=60.0))
