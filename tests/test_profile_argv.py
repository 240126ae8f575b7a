"""One source of truth (issue 29): a profile's params and argv are checked
against each other when it is loaded, and every param against the engine's
own argument types (vLLM 0.32's argparse, as qtune reads it:
tests/fixtures/vllm-0.32.0-cpu-engine-args.json)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from qtune.errors import ProfileError
from qtune.profile import Profile
from qtune.profile_argv import argv_value, check_sources

ROOT = Path(__file__).parents[1]
GPU = ROOT / "examples" / "h200-qwen3-4b" / "h200-qwen3-4b.yaml"  # --max-num-seqs 231
CPU = ROOT / "profiles" / "example-epyc-2vcpu-tiny-qwen2-vllm-cpu.yaml"
ARGS = json.loads((ROOT / "tests" / "fixtures" / "vllm-0.32.0-cpu-engine-args.json")
                  .read_text())


def _edited(tmp_path: Path, src: Path, change: Any) -> Path:
    data = yaml.safe_load(src.read_text())
    change(data)
    out = tmp_path / "p.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def _set(path: str, value: Any) -> Any:
    def change(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for k in parents:
            d = d[k]
        d[last] = value
    return change


def test_the_worked_examples_agree_with_themselves():
    for path in (GPU, CPU, *sorted((ROOT / "examples").glob("*/h200-*.yaml"))):
        prof = Profile.load(path)
        if prof.engine.name == "vllm":
            check_sources(prof, str(path), ARGS)  # and against vLLM's own types


def test_a_param_changed_without_its_flag_is_refused(tmp_path):
    """The issue's case: params.max_num_seqs to 64, argv keeps 231."""
    path = _edited(tmp_path, GPU, _set("params.max_num_seqs", 64))
    with pytest.raises(ProfileError) as e:
        Profile.load(path)
    msg = str(e.value)
    assert "params.max_num_seqs is 64 but argv has --max-num-seqs 231" in msg, msg
    assert "agree" in (e.value.hint or "")


@pytest.mark.parametrize(("change", "needle"), [
    # a switch on in params and off (absent) in argv
    (_set("params.enable_prefix_caching", False), "--enable-prefix-caching True"),
    # an env param: params and env disagree
    (_set("params.VLLM_CPU_KVCACHE_SPACE", 8), "env.VLLM_CPU_KVCACHE_SPACE is 4"),
    # a param argv does not carry at all
    (_set("params.max_model_len", 2048), "--max-model-len (not in argv)"),
])
def test_every_kind_of_difference_is_named(tmp_path, change, needle):
    with pytest.raises(ProfileError, match="params\\.") as e:
        Profile.load(_edited(tmp_path, CPU, change))
    assert needle in str(e.value), str(e.value)


@pytest.mark.parametrize(("name", "value", "needle"), [
    ("max_num_seqs", "fast", "takes an integer"),
    ("max_num_seqs", True, "takes an integer"),
    ("max_num_seqs", 6.5, "takes an integer"),
    ("enable_prefix_caching", "yes", "is a switch"),
    ("kv_cache_dtype", "fp7", "not one of"),
    ("max_num_sequences", 6, "has no such argument"),
])
def test_a_value_of_the_wrong_type_is_refused_by_the_engines_own_types(
        tmp_path, name, value, needle):
    """Even when argv says the same (both edited), the engine would refuse it."""
    def change(d: dict[str, Any]) -> None:
        d["params"][name] = value
        flag = "--" + name.replace("_", "-")
        d["argv"] = [w for w in d["argv"] if w != flag] + [flag, str(value)]
    prof = Profile.model_validate(yaml.safe_load(_edited(tmp_path, CPU, change).read_text()))
    with pytest.raises(ProfileError, match=needle):
        check_sources(prof, "p.yaml", ARGS)


def test_without_the_engines_types_a_word_for_a_number_still_differs(tmp_path, monkeypatch):
    # no cached copy of the engine's arguments (another test may have read them)
    monkeypatch.setenv("QTUNE_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ProfileError, match="params.max_num_seqs is fast but argv has "
                                           "--max-num-seqs 6"):
        Profile.load(_edited(tmp_path, CPU, _set("params.max_num_seqs", "fast")))


@pytest.mark.parametrize(("argv", "value"), [
    (["--max-num-seqs", "8"], "8"), (["--max-num-seqs=8"], "8"), (["--max_num_seqs", "8"], "8"),
    (["--max-num-seqs", "8", "--max-num-seqs", "9"], "9"),  # the last one wins
    (["--enable-prefix-caching"], True), (["--no-enable-prefix-caching"], False),
])
def test_argv_is_read_as_argparse_reads_it(argv, value):
    flag = "--enable-prefix-caching" if "prefix" in argv[0] else "--max-num-seqs"
    assert argv_value(["/usr/bin/python3", "-m", "x", *argv], flag) == value


def test_a_json_config_holds_the_params_keys(tmp_path):
    def change(d: dict[str, Any]) -> None:
        d["params"]["compilation_config"] = {"mode": 3}
        d["argv"] += ["--compilation-config", '{"mode": 3, "pass_config": {"x": false}}']
    Profile.load(_edited(tmp_path, CPU, change))  # the adapter may merge more in

    def wrong(d: dict[str, Any]) -> None:
        d["params"]["compilation_config"] = {"mode": 3}
        d["argv"] += ["--compilation-config", '{"mode": 2}']
    with pytest.raises(ProfileError, match="compilation_config"):
        Profile.load(_edited(tmp_path, CPU, wrong))


def test_a_value_the_adapter_leaves_out_must_be_absent(tmp_path):
    def change(d: dict[str, Any]) -> None:
        d["params"]["quantization"] = "none"  # the model's own dtype: no flag
    Profile.load(_edited(tmp_path, CPU, change))

    def flagged(d: dict[str, Any]) -> None:
        d["params"]["quantization"] = "none"
        d["argv"] += ["--quantization", "fp8"]
    with pytest.raises(ProfileError, match="quantization"):
        Profile.load(_edited(tmp_path, CPU, flagged))


def test_emit_refuses_a_drifted_profile_and_writes_nothing(tmp_path):
    path = _edited(tmp_path, GPU, _set("params.max_num_seqs", 64))
    out = tmp_path / "u.service"
    r = subprocess.run([sys.executable, "-m", "qtune", "emit", str(path), "--user", "root",
                        "--allow-tmp", "-o", str(out)], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode != 0 and not out.exists()
    assert "params.max_num_seqs is 64 but argv has --max-num-seqs 231" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_number_for_an_argument_the_engine_parses_as_text_is_accepted(tmp_path):
    """vLLM 0.32 reads --max-model-len with a parser of its own (2048 or 2k):
    a number there is what a profile carries, not a wrong type."""
    def change(d: dict[str, Any]) -> None:
        d["params"]["max_model_len"] = 2048
        d["argv"] = [*d["argv"], "--max-model-len", "2048"]
    prof = Profile.model_validate(yaml.safe_load(_edited(tmp_path, CPU, change).read_text()))
    check_sources(prof, "p.yaml", ARGS)
    change_bool = _set("params.max_model_len", True)
    prof = Profile.model_validate(yaml.safe_load(_edited(tmp_path, CPU, change_bool)
                                                 .read_text()))
    with pytest.raises(ProfileError, match="takes text"):
        check_sources(prof, "p.yaml", ARGS)
