"""Property tests: a profile with arbitrary text in any field is either
refused with a ProfileError, or emitted to files that, read back by the
format's own rules (tests/emit/readback.py, and systemd-analyze verify),
carry exactly the profile's argv and env and no other key, section or
document."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qtune.emit import emit
from qtune.emit.container import HOME, container_view, nonroot_env
from qtune.emit.systemd import _cache_env, unit_name
from qtune.errors import InputError, ProfileError
from qtune.profile import Profile
from tests.emit import readback as rb
from tests.fakes.profile import PYTHON, sample_profile

# Characters every format treats specially, and line breaks of every kind
# (YAML also breaks at U+0085, U+2028, U+2029).
_SPECIAL_CHARS = "$%\"'\\;#:-{}[]&*!|>@`,?=() \t\n\r\x00\x1b\x7f\x85\u2028\u2029\ufeff"
_SPECIAL = [
    "", "---", "...", "$", "$$", "$(HF_TOKEN)", "a$$(HF_TOKEN)b", "${HOME}", "$HOME",
    "%n", "%%", "%", ";", "\\;", "\\", "a\\", "#x", "- a", "? k", "k: v", "!!python/object",
    "'", '"', "[Service]", "\nExecStartPre=/bin/touch /tmp/pwned",
    "n\n---\napiVersion: v1\nkind: Pod", "x\ninclude: [evil.yaml]", "\ufffe", "\u202e",
    "null", "true", "1e3", "0x10", "~", "*a", "&a",
]
# Text a profile may hold, full of what the formats treat specially ...
odd = st.one_of(
    st.text(st.characters(exclude_categories=("Cc", "Cs", "Zl", "Zp")), max_size=16),
    st.text(alphabet="$%\"'\\;#:-{}[]&*!|>@`,?=() ab\u00e9\u4e2d", max_size=12),
    st.sampled_from([s for s in _SPECIAL if s.isprintable()]),
)
# ... and text it may not (control characters, line breaks of any kind).
hostile = st.one_of(
    st.text(max_size=16),
    st.text(alphabet=_SPECIAL_CHARS + "ab", max_size=12),
    st.sampled_from(_SPECIAL),
    st.lists(st.sampled_from(_SPECIAL), min_size=2, max_size=3).map("".join),
)


def mostly(usual: st.SearchStrategy[Any], rare: st.SearchStrategy[Any],
           one_in: int) -> st.SearchStrategy[Any]:
    # one_of() picks among distinct branches, so a weight is drawn explicitly
    return st.sampled_from(range(one_in)).flatmap(lambda i: rare if i == 0 else usual)


# About one field in sixteen hostile, so that a fair share of the profiles
# (about a third) get through to the emitters.
wild = mostly(odd, hostile, 16)


def often(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a valid value (so that emitters run), sometimes anything."""
    return mostly(valid, wild, 24)


ident = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
name = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True)
flag = st.from_regex(r"--[a-z][a-z-]{0,10}", fullmatch=True)
word = st.one_of(flag, wild, wild)
number = mostly(st.one_of(st.floats(0, 1e6), st.integers(0, 10**6)),
                st.sampled_from([float("nan"), float("inf"), -1.0, True]), 16)


@st.composite
def profiles(draw: st.DrawFn, exe: st.SearchStrategy[str] | None = None) -> dict[str, Any]:
    base = sample_profile().model_dump(mode="json")
    argv = [draw(exe if exe is not None else often(st.just(PYTHON))), "-m",
            draw(often(st.just("vllm.entrypoints.openai.api_server")))]
    if draw(st.booleans()):
        argv += ["--model", draw(often(st.just("/data/models/m")))]
    if draw(st.booleans()):
        argv += ["--port", draw(often(st.just("8000")))]
    argv += draw(st.lists(word, max_size=6))
    numa = draw(mostly(st.one_of(st.none(), st.integers(0, 3)), wild, 16))
    return base | {
        "name": draw(often(name)),
        "engine": {"name": "vllm", "version": draw(often(st.just("0.26.0"))),
                   "build": draw(st.sampled_from(["cpu", "cuda"]))},
        # the model id is free text (Description=, comment lines)
        "model": {"id": draw(wild.map(lambda s: s or "m")),
                  "path": draw(often(st.just("/data/models/m")))},
        "params": {"tensor_parallel_size": draw(often(st.integers(1, 4)))},
        "env": draw(st.dictionaries(often(ident), wild, max_size=4)),
        "argv": argv,
        "metrics": {
            "objective": {"name": draw(often(st.sampled_from(["e2e_p99", "ttft_p99"]))),
                          "direction": "minimize", "best": draw(number),
                          "baseline": draw(mostly(number, st.none(), 2))},
            "startup_s": draw(number),
        },
        "notes": draw(st.lists(wild, max_size=3)),
        "placement": draw(st.one_of(st.none(), st.fixed_dictionaries({
            "numa_node": st.just(numa),
            "cpus": often(st.just("0-3,8")) if numa is not None else st.none(),
            "why": wild}))),
        "host": {draw(often(ident)): draw(wild)},
    }


def load(tmp_path: Path, data: dict[str, Any]) -> Profile | None:
    """The profile as ``qtune emit`` reads it (a YAML file), or None when it
    is refused; a refusal is one line with a hint."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        return Profile.load(path)
    except ProfileError as exc:
        assert "\n" not in exc.message and exc.hint, exc.message
        return None


def unit_env(p: Profile) -> dict[str, str]:
    """The unit's environment: the cache folders, unless the profile sets
    its own, then the profile's."""
    return {**_cache_env(unit_name(p)), **p.env}


def expected_service_keys(p: Profile, user: str | None = None,
                          allow_tmp: bool = False) -> list[str]:
    gpu = p.engine.build == "cuda"
    keys = ["Type", "EnvironmentFile", *["Environment"] * len(unit_env(p)), "ExecStart",
            "TimeoutStartSec", "TimeoutStopSec", "KillMode", "Restart", "RestartSec",
            "LimitNOFILE", "DynamicUser" if user is None else "User", "CacheDirectory",
            "StateDirectory", *(["SupplementaryGroups"] if gpu and user != "root" else []),
            "NoNewPrivileges", *([] if allow_tmp else ["PrivateTmp"]),
            "ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups",
            "RestrictSUIDSGID", "LockPersonality"]
    if gpu:
        keys += ["DevicePolicy", *["DeviceAllow"] * 4]
    if (p.placement or {}).get("numa_node") is not None:
        keys += ["CPUAffinity", "NUMAPolicy", "NUMAMask"]
    return keys


def check_systemd(p: Profile, text: str, user: str | None = None,
                  allow_tmp: bool = False) -> None:
    unit = rb.parse_unit(text)
    assert unit.sections == ["Unit", "Service", "Install"]
    assert unit.keys("Unit") == ["Description", "After", "Wants"]
    assert unit.keys("Install") == ["WantedBy"]
    assert unit.keys("Service") == expected_service_keys(p, user, allow_tmp)
    (exec_start,) = unit.values("Service", "ExecStart")
    assert rb.exec_start_argv(exec_start) == p.argv
    assert rb.environment(unit.values("Service", "Environment")) == unit_env(p)
    rb.specifiers(unit.values("Unit", "Description")[0])
    place = p.placement or {}
    if place.get("numa_node") is not None:
        assert unit.values("Service", "CPUAffinity") == [place["cpus"]]
        assert unit.values("Service", "NUMAMask") == [str(place["numa_node"])]


def _expected_args(p: Profile, args: list[str]) -> None:
    """The container's args are the profile's, word for word, except the
    values qtune rewrites on purpose (model paths, --host)."""
    words = [w for a in p.argv[3:] for w in (
        a.split("=", 1) if a.startswith("--") and "=" in a else [a])]
    assert len(args) == len(words)
    for i, (got, want) in enumerate(zip(args, words, strict=True)):
        if i and words[i - 1] in ("--model", "--tokenizer", "--host"):
            continue
        assert got == want


def _strings(doc: Any) -> list[str]:
    if isinstance(doc, str):
        return [doc]
    if isinstance(doc, dict):
        return [s for v in doc.values() for s in _strings(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in _strings(v)]
    return []


def check_compose(p: Profile, text: str) -> None:
    (doc,) = yaml.safe_load_all(text)
    assert set(doc) == {"services"}
    (svc,) = doc["services"].values()
    keys = {"image", "entrypoint", "command", "environment", "user", "read_only", "tmpfs",
            "security_opt", "cap_drop", "shm_size", "ports", "deploy", "healthcheck",
            "restart", "stop_grace_period"}
    place = p.placement or {}
    keys |= {"cpuset"} if place.get("numa_node") is not None else set()
    keys |= {"volumes"} if container_view(p, home=HOME).mounts else set()
    assert set(svc) == keys
    assert ("devices" in svc["deploy"]["resources"]["reservations"]) == (
        p.engine.build == "cuda")
    for s in _strings(doc):  # compose interpolates every value
        rb.compose_unescape(s)
    un = rb.compose_unescape
    assert [un(a) for a in svc["entrypoint"]] == ["python3", "-m", p.argv[2]]
    _expected_args(p, [un(a) for a in svc["command"]])
    env = {k: un(v) if v is not None else None for k, v in svc["environment"].items()}
    assert env == {**nonroot_env(), **{k: v for k, v in p.env.items() if k != "PYTHONPATH"},
                   "HF_TOKEN": None}


def check_kubernetes(p: Profile, text: str) -> None:
    docs = list(yaml.safe_load_all(text))
    assert [(d["apiVersion"], d["kind"]) for d in docs] == [
        ("apps/v1", "Deployment"), ("v1", "Service"), ("networking.k8s.io/v1", "NetworkPolicy")]
    dep, svc, policy = docs
    assert set(dep) == set(svc) == set(policy) == {"apiVersion", "kind", "metadata", "spec"}
    pod = dep["spec"]["template"]["spec"]
    assert set(pod) == {"containers", "volumes", "terminationGracePeriodSeconds",
                        "automountServiceAccountToken", "securityContext"}
    (c,) = pod["containers"]
    keys = {"name", "image", "command", "args", "env", "ports", "volumeMounts",
            "startupProbe", "readinessProbe", "livenessProbe", "resources", "securityContext"}
    assert set(c) == keys
    ex = rb.k8s_expand_all
    assert [ex(a) for a in c["command"]] == ["python3", "-m", p.argv[2]]
    _expected_args(p, [ex(a) for a in c["args"]])
    env = {e["name"]: ex(e["value"]) for e in c["env"] if "value" in e}
    own = {"HOME": "/home/qtune", "USER": "qtune", "XDG_CACHE_HOME": "/home/qtune/.cache",
           "HF_HOME": "/home/qtune/.cache/huggingface"}
    assert env == {**own, **{k: v for k, v in p.env.items() if k != "PYTHONPATH"},
                   "HF_TOKEN_PATH": "/var/run/secrets/huggingface/token"}
    assert all("value" in e for e in c["env"])  # no secret reference in an env value
    assert "privileged" not in text and "hostPID" not in text.replace("hostPath", "")


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(data=profiles())
def test_any_profile_is_refused_or_read_back_exactly(tmp_path, data):
    p = load(tmp_path, data)
    if p is None:
        return
    try:
        check_systemd(p, emit(p, "systemd"))
    except InputError as exc:  # a path PrivateTmp= hides, or below /root
        assert ("/tmp" in exc.message or "/root" in exc.message) and exc.hint
    for fmt, check in (("compose", check_compose), ("kubernetes", check_kubernetes)):
        try:
            text = emit(p, fmt)
        except InputError as exc:  # e.g. not `python -m`, a relative --model
            assert "\n" not in exc.message and exc.hint
            continue
        check(p, text)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze not installed (.ci/run installs it)")
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(data=profiles(exe=st.just(PYTHON)))
def test_systemd_analyze_accepts_every_unit_that_is_emitted(tmp_path, data):
    p = load(tmp_path, data)
    if p is None:
        return
    text = emit(p, "systemd")
    check_systemd(p, text)
    rb.assert_systemd_verifies(tmp_path / "qtune-prop.service", text)


def test_the_generator_reaches_both_outcomes(tmp_path):
    """The property tests above are not vacuous: hostile text is refused,
    and profiles full of $, %, quotes and YAML syntax are emitted."""
    odd = sample_profile(argv=sample_profile().argv + [
        "a$$(HF_TOKEN)b", "%n", "---", "\\;", ";", 'x"y', "k: v", "#c", ""],
        env={"A": "$(B) %n 'q' \"d\" \\"}, notes=["--- a: b", "# x \\"],
        placement={"numa_node": 0, "cpus": "0-1", "why": "odd \\"})
    check_systemd(odd, emit(odd, "systemd"))
    check_compose(odd, emit(odd, "compose"))
    check_kubernetes(odd, emit(odd, "kubernetes"))
    data = odd.model_dump(mode="json") | {"notes": ["x\n---\nkind: Pod"]}
    assert load(tmp_path, data) is None


@given(st.text(), st.integers(2, 400))
def test_clip_keeps_a_prefix_no_longer_than_its_limit(text, limit):
    """Untrusted text (a trial's reason) clipped for a tooltip or a table:
    never longer than asked, a prefix of the text, whole when it fits."""
    from qtune.errors import clip

    out = clip(text, limit)
    assert len(out) <= limit
    if len(text) <= limit:
        assert out == text
    else:
        assert out.endswith("…") and text.startswith(out[:-1])
