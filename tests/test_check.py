"""``qtune check``'s pieces: what a vLLM server reports about its config, how
it is compared with a profile, and where the noise band comes from."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from qtune.check import (
    GOODPUT_NOISE,
    THROUGHPUT_NOISE,
    Comparison,
    _norm,
    _reference,
    compare_config,
)
from qtune.engines.vllm import read_running_config
from qtune.launch import RunningConfig
from qtune.objectives import OBJECTIVES, get_objective, lower_is_better, worse_by
from tests.fakes.profile import sample_profile

# The shape of vLLM 0.32's line (every CacheConfig field is a label).
METRICS = (
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="128",cache_dtype="auto",'
    'enable_prefix_caching="False",engine="0",gpu_memory_utilization="0.92",'
    'num_gpu_blocks="None"} 1.0\n'
)
SERVER_INFO = json.dumps({"vllm_config": {
    "scheduler_config": {"max_num_seqs": 8, "max_num_batched_tokens": 2048},
    "cache_config": {"enable_prefix_caching": False},
    "model_config": {"max_model_len": 2048}},
    "vllm_env": {"VLLM_CPU_KVCACHE_SPACE": "1"}})


def test_reads_version_cache_info_and_server_info():
    rc = read_running_config({"/version": '{"version": "0.32.0"}', "/metrics": METRICS,
                              "/server_info?config_format=json": SERVER_INFO})
    assert rc.version == "0.32.0"
    assert rc.params["enable_prefix_caching"] is False
    assert rc.params["block_size"] == 128 and rc.params["kv_cache_dtype"] == "auto"
    assert rc.params["max_num_seqs"] == 8 and rc.params["VLLM_CPU_KVCACHE_SPACE"] == 1
    assert rc.sources["block_size"].startswith("/metrics")
    assert rc.sources["max_num_seqs"] == "/server_info"


def test_without_dev_mode_only_what_metrics_say():
    rc = read_running_config({"/metrics": METRICS})
    assert rc.version is None and "max_num_seqs" not in rc.params


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["/version", "/metrics",
                                        "/server_info?config_format=json"]),
                       st.text(max_size=300)))
def test_untrusted_reports_never_raise(reports):
    rc = read_running_config(reports)
    assert isinstance(rc.params, dict)


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda c: st.lists(c, max_size=3)
                    | st.dictionaries(st.text(max_size=20), c, max_size=3), max_leaves=20))
def test_odd_server_info_json_never_raises(doc):
    read_running_config({"/server_info?config_format=json": json.dumps(doc)})


def test_values_compare_by_meaning():
    assert _norm(0.9) == _norm("0.9") and _norm(8) == _norm(8.0) == _norm("8")
    assert _norm(True) == _norm("True") and _norm("fp8") == _norm("FP8")
    assert _norm(1) != _norm(2)


def _prof(**over):
    base = dict(model={"id": "tiny", "path": "/m", "served_name": "tiny"},
                params={"max_num_seqs": 8, "enable_prefix_caching": False},
                env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    return sample_profile(**{**base, **over})


def test_compare_names_each_difference_and_what_was_not_checked():
    running = RunningConfig("0.32.0", {"max_num_seqs": 16, "VLLM_CPU_KVCACHE_SPACE": 1},
                            {"max_num_seqs": "/server_info"})
    cmp = compare_config(_prof(), running, "tiny")
    assert [d["what"] for d in cmp["differ"]] == ["max_num_seqs"]
    assert cmp["differ"][0]["tuned"] == 8 and cmp["differ"][0]["running"] == 16
    assert cmp["not_checked"] == ["enable_prefix_caching"]
    assert "VLLM_CPU_KVCACHE_SPACE" in cmp["checked"]


def test_compare_catches_version_and_served_model():
    cmp = compare_config(_prof(), RunningConfig("0.33.1"), "other")
    assert {d["what"] for d in cmp["differ"]} == {"engine version", "served model"}


def test_noise_band_from_confirmation_spread_or_the_agreement_bound():
    prof = _prof(metrics={"objective": {"name": "e2e_p99", "direction": "minimize",
                                        "best": 500.0, "baseline": 700.0},
                          "best": {"e2e_ms": {"p99": 500.0}},
                          "confirmation": {"1": {"values": [370.0, 690.0],
                                                 "median": 530.0}}})
    value, band, source = _reference(prof, "e2e_p99")  # the study ref's trial is 1
    assert value == 530.0 and "confirmation" in source
    assert abs(band - 160 / 530) < 1e-9  # wider than the 25% bound: the spread wins
    plain = _prof(metrics={"objective": {"name": "e2e_p50", "direction": "minimize",
                                         "best": 100.0, "baseline": 150.0},
                           "best": {"e2e_ms": {"p50": 100.0}}})
    assert _reference(plain, "e2e_p50") == (100.0, 0.10, "the search's measurement")


def _fake_server(name: str):
    import subprocess
    import sys
    import time
    import urllib.request

    from qtune.server import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.llm_server", str(port), name,
                             "--delay-ms", "2"])
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("fake server did not start")


def test_speed_verdicts_against_a_running_server():
    from qtune.check import AS_TUNED, SLOWER, check

    proc, url = _fake_server("tiny")
    try:
        wl = {"input_len": 8, "output_len": 8, "concurrency": 2, "requests": 12,
              "warmup_requests": 2}

        def prof(p99: float):
            return _prof(workload=wl, metrics={
                "objective": {"name": "e2e_p99", "direction": "minimize", "best": p99,
                              "baseline": None}, "best": {"e2e_ms": {"p99": p99}}})

        fast = check(prof(10_000.0), url)  # the server is far faster than "tuned"
        assert fast["exit_code"] == AS_TUNED and fast["config"]["differ"] == []
        slow = check(prof(0.01), url)  # tuned at 0.01 ms: now hundreds of times slower
        assert slow["exit_code"] == SLOWER and "slower than tuned by" in slow["verdict"]
        assert slow["compare"]["noise"] == 0.25
        other = check(_prof(model={"id": "x", "path": "/m", "served_name": "other"},
                            workload=wl), url)
        assert other["exit_code"] == 5 and "runs" not in other
    finally:
        proc.kill()
        proc.wait()


# -- every objective kind: what is judged, against which reference -----------

def _objective_profile(name: str, best: dict, objective_best: float | None,
                       conf_median: float | None = None, slo: list[str] | None = None,
                       workload: dict | None = None):
    conf = {"1": {"values": [conf_median, conf_median], "median": conf_median}} \
        if conf_median is not None else None
    direction = "pareto" if name.startswith("pareto") else get_objective(name).direction
    return _prof(workload=workload or {}, slo=slo or [], metrics={
        "objective": {"name": name, "direction": direction, "best": objective_best,
                      "baseline": None},
        "best": best, "confirmation": conf})


def test_goodput_is_judged_on_goodput_in_its_own_units():
    # The bug of issue 30: a goodput profile was judged on e2e_p99 against
    # its confirmation median in req/s.
    prof = _objective_profile("goodput", {"e2e_ms": {"p99": 900.0}}, 3.2, conf_median=3.0,
                              slo=["e2e_p99<=2000ms"])
    assert get_objective("goodput").judged_metrics == ("goodput",)
    tuned, band, source = _reference(prof, "goodput")
    assert tuned == 3.0 and "confirmation" in source and band == GOODPUT_NOISE
    # Another metric never takes the objective's confirmation median.
    assert _reference(prof, "e2e_p99")[0] == 900.0


def test_throughput_reference_and_direction():
    prof = _objective_profile("throughput", {"request_throughput": 5.0}, 5.0)
    assert _reference(prof, "throughput") == (5.0, THROUGHPUT_NOISE,
                                              "the search's measurement")
    c = Comparison("throughput", tuned=5.0, now=4.0, noise=0.05, tuned_from="x")
    assert c.slower and abs(c.worse_by - 0.25) < 1e-9
    assert not Comparison("throughput", 5.0, 6.0, 0.05, "x").slower


def test_pareto_is_judged_on_both_coordinates():
    obj = get_objective("pareto:ttft_p99")
    assert obj.judged_metrics == ("ttft_p99", "throughput")
    prof = _objective_profile("pareto:ttft_p99", {"ttft_ms": {"p99": 40.0},
                                                  "request_throughput": 2.0}, None)
    assert _reference(prof, "ttft_p99")[0] == 40.0
    assert _reference(prof, "throughput")[0] == 2.0


def test_every_objective_has_a_sense():
    for name in [*OBJECTIVES, "pareto", "pareto:tpot_p99"]:
        obj = get_objective(name)
        assert obj.sign in (1, -1) and obj.judged_metrics
        for m in obj.judged_metrics:
            # a 10% worse figure is worse in the metric's own sense
            now = 110.0 if lower_is_better(m) else 100 / 1.1
            assert abs(worse_by(m, 100.0, now) - 0.1) < 1e-9


WL = {"input_len": 8, "output_len": 8, "concurrency": 2, "requests": 12,
      "warmup_requests": 2}
LOOSE = ["e2e_p99<=60000ms"]


def _fake_server_profiles():
    """For each objective kind, a profile the fake server beats by far
    (as tuned) and one it cannot reach (slower)."""
    def latency(name, metric, v):
        base, _, pct = metric.rpartition("_")
        return _objective_profile(name, {f"{base}_ms": {pct: v}}, v, workload=WL)

    def rate(name, key, v, slo=None):
        return _objective_profile(name, {key: v}, v, workload=WL, slo=slo)

    return {
        "e2e_p99": (latency("e2e_p99", "e2e_p99", 1e6), latency("e2e_p99", "e2e_p99", 1e-3)),
        "ttft_p50": (latency("ttft_p50", "ttft_p50", 1e6),
                     latency("ttft_p50", "ttft_p50", 1e-3)),
        "throughput": (rate("throughput", "request_throughput", 1e-3),
                       rate("throughput", "request_throughput", 1e6)),
        "output_throughput": (rate("output_throughput", "output_token_throughput", 1e-3),
                              rate("output_throughput", "output_token_throughput", 1e6)),
        "goodput": (_objective_profile("goodput", {}, 1e-3, workload=WL, slo=LOOSE),
                    _objective_profile("goodput", {}, 1e6, workload=WL, slo=LOOSE)),
        "pareto": tuple(_objective_profile(
            "pareto", {"e2e_ms": {"p99": lat}, "request_throughput": thr}, None,
            workload=WL) for lat, thr in ((1e6, 1e-3), (1e6, 1e6))),
        "capacity": (_objective_profile("capacity", {}, 1, workload=WL, slo=LOOSE),
                     _objective_profile("capacity", {}, 2, workload=WL,
                                        slo=["e2e_p99<=0.001ms"])),
    }


def test_check_gives_a_verdict_for_every_objective_kind():
    from qtune.check import AS_TUNED, SLOWER, check

    cases = _fake_server_profiles()
    # every registered objective kind (and pareto) is covered here
    def kind(name: str) -> str:
        obj = get_objective(name)
        return "latency" if obj.direction == "minimize" else obj.direction \
            if obj.is_pareto else name
    assert {kind(n) for n in [*OBJECTIVES, "pareto"]} == {kind(n) for n in cases}
    proc, url = _fake_server("tiny")
    try:
        for name, (fine, slow) in cases.items():
            ok = check(fine, url)
            assert ok["exit_code"] == AS_TUNED, (name, ok["verdict"])
            bad = check(slow, url)
            assert bad["exit_code"] == SLOWER, (name, bad["verdict"])
            if name != "capacity":
                judged = get_objective(name).judged_metrics
                assert [c["metric"] for c in bad["compared"]] == list(judged)
                json.loads(json.dumps(ok), parse_constant=_no_constant)
    finally:
        proc.kill()
        proc.wait()


def _no_constant(name):
    raise AssertionError(f"non-strict JSON constant {name}")
