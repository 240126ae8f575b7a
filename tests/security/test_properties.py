"""Property tests for the helpers every class of issue 28 rests on: the
redaction, the console's escaping, CSV cells, the bounded JSON and YAML
readers, and the checks of a write target."""

from __future__ import annotations

import io
import string
import time
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qtune import console
from qtune.errors import InputError, redact
from qtune.files import check_target, csv_cell
from qtune.untrusted import BadData, loads
from qtune.yamlfile import safe_load

FAST = settings(max_examples=50, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
# A password may hold anything but whitespace (and no quote, which ends the
# word it is in); reserved characters included.
password = st.text(alphabet=string.ascii_letters + string.digits + "/?#@:[]!$&'()*+,;=%-._~",
                   min_size=6, max_size=40).filter(lambda s: "'" not in s)
user = st.text(alphabet=string.ascii_letters + string.digits, min_size=1, max_size=10)
noise = st.text(max_size=200)


@FAST
@given(user, password, noise, noise)
def test_userinfo_password_is_masked_whatever_it_holds(u, pw, before, after):
    secret = "Zq9" + pw  # a recognisable core
    text = f"{before} http://{u}:{secret}@host:8000/v1 {after}"
    assert "Zq9" + pw not in redact(text)


@FAST
@given(st.sampled_from(["password", "passwd", "pwd", "token", "api_key", "apikey",
                        "access_token", "secret", "key", "auth", "client_secret"]),
       st.text(alphabet=string.ascii_letters + string.digits, min_size=6, max_size=30),
       st.sampled_from(["?", "&", " ", ";"]))
def test_secret_named_parameters_are_masked(name, value, sep):
    for text in (f"http://h/x{sep}{name}={value}", f"host=db {name}={value} user=x",
                 f'"{name}": "{value}"'):
        # the value's own place is masked (it may also be a part of the name:
        # Hypothesis drew name and value both 'secret')
        assert redact(text).count(value) == text.count(value) - 1, text


@FAST
@given(st.text(max_size=2000))
def test_redact_never_raises_and_is_idempotent(text):
    once = redact(text)
    assert redact(once) == once


def test_redact_is_linear():
    for unit in ("a", "key=", "://a:", "a@", "hf_", "=", "Bearer "):
        big = unit * (65536 // len(unit))
        t0 = time.perf_counter()
        redact(big)
        small_t = time.perf_counter() - t0
        assert small_t < 0.5, (unit, small_t)


@FAST
@given(st.text(max_size=300))
def test_console_never_emits_control_characters(text):
    buf = io.StringIO()
    c = console._Console(file=buf, highlight=False, markup=False, emoji=False,
                         width=100000, force_terminal=False)
    c.print(text)
    c.print(console.Text("x " + text))
    shown = buf.getvalue()
    assert all(ch == "\n" or ch >= " " for ch in shown if ord(ch) < 0x20 or ch == "\x7f")
    assert "\x1b" not in shown and "\x7f" not in shown
    assert shown.count("\n") == 2  # one line each, whatever the text holds


@FAST
@given(st.text(max_size=80))
def test_markup_is_never_interpreted(text):
    buf = io.StringIO()
    c = console._Console(file=buf, highlight=False, markup=False, emoji=False, width=1000)
    c.print("[bold]" + text + "[/]")  # must not raise
    assert buf.getvalue().startswith("[bold]")


@FAST
@given(st.text(max_size=60))
def test_csv_cells_never_start_a_formula(text):
    cell = csv_cell(text)
    if cell[:1] in ("=", "+", "-", "@", "\t", "\r"):
        float(cell)  # only a number may start so


@FAST
@given(st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6)
                    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
                    lambda kids: st.lists(kids, max_size=4)
                    | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                    max_leaves=30))
def test_bounded_readers_read_what_they_should(value):
    import json

    assert loads(json.dumps(value), "x") == value
    assert safe_load(yaml.safe_dump(value)) == value


@FAST
@given(st.binary(max_size=300))
def test_bounded_json_fails_only_as_bad_data(blob):
    try:
        loads(blob, "x")
    except BadData:
        pass


@FAST
@given(st.text(alphabet="[]{}:,&*!<>- \n\"'ab1", max_size=300))
def test_bounded_yaml_fails_only_as_yaml_errors(text):
    try:
        safe_load(text)
    except (yaml.YAMLError, ValueError):
        pass


@FAST
@given(st.text(min_size=1, max_size=300))
def test_write_targets_are_checked_never_crash(tmp_path: Path, name: str):
    try:
        check_target(tmp_path / name, "-o")
    except InputError:
        pass
    except ValueError:  # (pathlib refuses NUL itself; still no write)
        assert "\0" in name


numbers = (st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10**40, 10**40)
           | st.sampled_from([1e300, -1e300, 10**5000 // 10**4990, 0.1, 5e-324]))


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["metrics.startup_s", "metrics.best.request_throughput",
                        "metrics.objective.best", "workload.rate", "params.max_num_seqs"]),
       numbers)
def test_profile_numbers_are_refused_or_written_plainly(field, value):
    import re

    from qtune.emit import emit
    from qtune.errors import QtuneError
    from qtune.profile import Profile
    from tests.fakes.profile import sample_profile

    d = sample_profile().model_dump(mode="json")
    d["metrics"]["objective"]["name"] = "capacity"
    *head, last = field.split(".")
    node = d
    for k in head:
        node = node.setdefault(k, {})
    node[last] = value
    try:
        prof = Profile.model_validate(d)
    except Exception:  # (a ValidationError: refused, which is fine)
        return
    for fmt in ("systemd", "kubernetes", "grafana", "prometheus-rules"):
        try:
            text = emit(prof, fmt, None, "keda" if fmt == "kubernetes" else None, 4, None)
        except QtuneError:
            continue
        low = text.lower()
        assert "infinity" not in low and not re.search(r"\b(nan|inf)\b", low), fmt
        assert not re.search(r"[0-9]{25}", text), fmt


@FAST
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda k: st.lists(k, max_size=3) | st.dictionaries(st.text(), k,
                                                                          max_size=3),
                    max_leaves=15))
def test_a_models_answer_is_a_name_or_an_input_error(monkeypatch, answer):
    from qtune import bench

    monkeypatch.setattr(bench, "request_json", lambda url: answer)
    try:
        name, root = bench.served_model("http://127.0.0.1:1")
        assert isinstance(name, str)
    except InputError:
        pass
