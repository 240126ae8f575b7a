from __future__ import annotations

import json
import random
import statistics

import pytest

from qtune.errors import InputError
from qtune.load import inter_arrivals
from qtune.load.prompts import RequestSource
from qtune.load.workload import Lengths, Workload, load_workload_file
from qtune.model import generated_tokenizer


@pytest.mark.parametrize(
    ("text", "kind", "lo", "hi"),
    [("256", "fixed", 256, 256), (64, "fixed", 64, 64), ("128-512", "uniform", 128, 512),
     ("128:512", "uniform", 128, 512), ("normal:256:64", "normal", 256, 256 + 4 * 64)],
)
def test_lengths_parse(text, kind, lo, hi):
    ln = Lengths.parse(text, "--input-len")
    assert ln.kind == kind and ln.max == hi
    rng = random.Random(0)
    vals = [ln.sample(rng) for _ in range(500)]
    assert min(vals) >= 1
    if kind != "normal":
        assert lo <= min(vals) and max(vals) <= hi
    else:
        assert 230 < statistics.mean(vals) < 280


@pytest.mark.parametrize("bad", ["0", "-5", "512-128", "abc", "normal:1", "1.5"])
def test_lengths_reject(bad):
    with pytest.raises(InputError) as e:
        Lengths.parse(bad, "--output-len")
    assert "--output-len" in e.value.message and e.value.hint


def test_constant_and_bursty_arrivals():
    wl = Workload(rate=4, arrival="constant")
    gap = inter_arrivals(wl, random.Random(0))
    assert {gap() for _ in range(10)} == {0.25}
    for b in (0.25, 1.0, 4.0):
        gap = inter_arrivals(Workload(rate=4, burstiness=b), random.Random(1))
        xs = [gap() for _ in range(20000)]
        assert statistics.mean(xs) == pytest.approx(0.25, rel=0.05)
        # Coefficient of variation of Gamma(shape b) is 1/sqrt(b).
        cv = statistics.pstdev(xs) / statistics.mean(xs)
        assert cv == pytest.approx(b ** -0.5, rel=0.1)


def test_shared_prefix_requests_have_exact_lengths(tmp_path, monkeypatch):
    monkeypatch.setenv("QTUNE_CACHE", str(tmp_path))
    tok = generated_tokenizer(1024)
    wl = Workload(input_len=32, output_len=8, prefix_count=3, prefix_len=100)
    reqs = RequestSource(wl, tok, seed=5).take(40)
    assert all(r.prompt_tokens == 132 and r.max_tokens == 8 for r in reqs)
    prefixes = {" ".join(r.prompt.split()[:100]) for r in reqs}
    assert len(prefixes) == 3  # N distinct system prompts, reused
    again = RequestSource(wl, tok, seed=5).take(40)
    assert [r.prompt for r in again] == [r.prompt for r in reqs]


def test_jsonl_dataset(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": f"question {i} " * 3,
                                       "output_tokens": 10 + i}) for i in range(5)))
    wl = Workload(dataset=str(f), output_len=7)
    reqs = RequestSource(wl, None, seed=0).take(7)
    assert sorted({r.max_tokens for r in reqs[:5]}) == [10, 11, 12, 13, 14]
    assert reqs[5].prompt == reqs[0].prompt  # cycles after the file
    order = [r.prompt for r in RequestSource(wl, None, seed=1).take(5)]
    assert order != [r.prompt for r in reqs[:5]]  # the seed picks the sample


def test_sharegpt_dataset(tmp_path):
    conv = [{"conversations": [{"from": "human", "value": "tell me about the sea now"},
                               {"from": "gpt", "value": "the sea is big and blue"}]},
            {"conversations": [{"from": "human", "value": "hi"},
                               {"from": "gpt", "value": "too short a question"}]}]
    f = tmp_path / "sg.json"
    f.write_text(json.dumps(conv))
    reqs = RequestSource(Workload(dataset=str(f)), None, seed=0).take(2)
    assert {r.prompt for r in reqs} == {"tell me about the sea now"}
    assert reqs[0].max_tokens == 6


@pytest.mark.parametrize("content", ['{"text": "x"}\n', "not json\n", '{"prompt": 3}\n'])
def test_bad_dataset(tmp_path, content):
    f = tmp_path / "d.jsonl"
    f.write_text(content)
    with pytest.raises(InputError, match="line 1"):
        RequestSource(Workload(dataset=str(f)), None, seed=0)


def test_workload_file(tmp_path):
    f = tmp_path / "w.yaml"
    f.write_text("input_len: 100-200\nrate: 3\nburstiness: 0.5\nrequests: 50\n")
    wl = Workload(**load_workload_file(f))
    assert wl.mode == "poisson 3 req/s, burstiness 0.5"
    assert wl.max_total_len == 200 + 64
    f.write_text("input_lenght: 5\n")
    with pytest.raises(InputError) as e:
        load_workload_file(f)
    assert "input_len" in e.value.hint


@pytest.mark.parametrize(
    "kw", [{"arrival": "uniform"}, {"burstiness": 0}, {"endpoint": "embeddings"},
           {"prefix_count": 2}, {"dataset": "/nonexistent.jsonl"}],
)
def test_workload_rejects(kw):
    with pytest.raises(InputError):
        Workload(**kw)


def test_count_bound_poisson_offers_exactly_the_rate():
    from qtune.load import _normalised

    for seed in range(5):
        gap = _normalised(inter_arrivals(Workload(rate=4), random.Random(seed)), 200, 4.0)
        xs = [gap() for _ in range(200)]
        assert sum(xs) == pytest.approx(50.0)  # 200 requests / 4 req/s
        assert statistics.pstdev(xs) > 0.1  # still random gaps


# --- defaults and refusals (issue 13 item 6, issue 14) ----------------------


def test_a_duration_alone_has_no_request_bound():
    """`qtune bench --duration 5` stopped after Workload's default 100
    requests in a fraction of a second."""
    assert Workload(concurrency=1, duration=5).requests is None
    assert Workload(concurrency=1).requests == 200  # no bound given: a count
    assert Workload(concurrency=1, duration=5, requests=50).requests == 50


def test_cli_workload_with_duration_only_is_unbounded_in_count():
    from qtune.cli import LoadOptions

    opts = {"workload": None, "input_len": None, "output_len": None, "rate": None,
            "concurrency": None, "requests": None, "duration": 5.0, "warmup": None,
            "seed": None, "arrival": None, "burstiness": None, "dataset": None,
            "prefix_count": None, "prefix_len": None, "endpoint": None,
            "request_timeout": None, "stall_timeout": None}
    wl = LoadOptions(opts).workload()
    assert wl.requests is None and wl.duration == 5.0
    assert wl.request_timeout == 600.0 and wl.stall_timeout == 60.0


@pytest.mark.parametrize(
    ("kw", "flag"),
    [
        ({"rate": float("nan")}, "--rate"),
        ({"rate": float("inf")}, "--rate"),
        ({"rate": 1e-300}, "--rate"),
        ({"rate": "fast"}, "--rate"),
        ({"rate": True}, "--rate"),
        ({"rate": 4, "burstiness": float("nan")}, "--burstiness"),
        ({"rate": 4, "burstiness": float("inf")}, "--burstiness"),
        ({"rate": 4, "burstiness": 1e-9}, "--burstiness"),
        ({"duration": float("nan")}, "--duration"),
        ({"duration": float("inf")}, "--duration"),
        ({"requests": 1.5}, "--requests"),
        ({"requests": True}, "--requests"),
        ({"requests": "10"}, "--requests"),
        ({"concurrency": 2.5}, "--concurrency"),
        ({"warmup_requests": None}, "--warmup"),
        ({"request_timeout": float("nan")}, "--request-timeout"),
        ({"stall_timeout": 0}, "--stall-timeout"),
        ({"stall_timeout": -1}, "--stall-timeout"),
    ],
)
def test_workload_refuses_values_up_front(kw, flag):
    with pytest.raises(InputError) as e:
        Workload(**kw)
    assert e.value.message.startswith(flag) and e.value.hint


@pytest.mark.parametrize(
    ("yaml_text", "flag"),
    [("rate: fast\n", "--rate"), ("requests: 1.5\n", "--requests"),
     ("requests: true\n", "--requests"), ("rate: .nan\n", "--rate"),
     ("burstiness: .inf\nrate: 2\n", "--burstiness")],
)
def test_workload_file_values_are_one_clear_error(tmp_path, yaml_text, flag):
    f = tmp_path / "w.yaml"
    f.write_text(yaml_text)
    with pytest.raises(InputError) as e:
        Workload(**load_workload_file(f))
    assert e.value.message.startswith(flag) and e.value.hint


@pytest.mark.parametrize(
    ("content", "where"),
    [(b"[1, 2, 3]", "item 0"), (b'[{"conversations": "x"}]', "item 0"),
     (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "not UTF-8"),
     (b'{"prompt": "x", "output_tokens": 1.5}\n', "line 1"),
     (b'{"prompt": "x", "output_tokens": true}\n', "line 1")],
    ids=["list-of-ints", "conversations-not-list", "binary", "fraction", "bool"],
)
def test_bad_dataset_is_refused_when_the_workload_is_built(tmp_path, content, where):
    """Before any server starts: the Workload itself reads the file."""
    f = tmp_path / "d.json"
    f.write_bytes(content)
    with pytest.raises(InputError) as e:
        Workload(dataset=str(f))
    assert where in e.value.message and e.value.hint


def test_dataset_is_parsed_once_per_file_version(tmp_path):
    import dataclasses

    from qtune.load import datasets as wmod

    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"prompt": "a b c d", "output_tokens": 4}) + "\n")
    wmod._parse_dataset.cache_clear()
    wl = Workload(dataset=str(f))
    for seed in range(5):
        dataclasses.replace(wl, seed=seed)
    assert wmod._parse_dataset.cache_info().misses == 1
    f.write_text("not json\n")  # a new version of the file is read again
    with pytest.raises(InputError):
        dataclasses.replace(wl, seed=9)


def test_timeouts_at_defaults_stay_out_of_the_saved_workload():
    """A study saved before the timeouts existed compares workload dicts."""
    assert "stall_timeout" not in Workload(rate=2).to_dict()
    d = Workload(rate=2, stall_timeout=5).to_dict()
    assert d["stall_timeout"] == 5 and Workload(**d).stall_timeout == 5
