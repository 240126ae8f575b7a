"""The option groups (qtune.options): each field with an ``option`` is a
flag of the commands that take its group, in its help panel, and reaches
the field; not given, it keeps the field's default."""

from __future__ import annotations

import dataclasses

import typer
from typer.testing import CliRunner

from qtune.cli_options import with_option_groups
from qtune.options import (
    GROUPS,
    CapacitySearch,
    Confirmation,
    Fleet,
    QualityGate,
    cli_fields,
    cli_name,
    grouped,
)


def _app(got: dict[str, object]) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @with_option_groups
    def cmd(n: int = 1, confirm: Confirmation = Confirmation(),  # noqa: B008
            capacity: CapacitySearch = CapacitySearch(),  # noqa: B008
            quality: QualityGate = QualityGate(), fleet: Fleet = Fleet()) -> None:  # noqa: B008
        got.update(n=n, confirm=confirm, capacity=capacity, quality=quality, fleet=fleet)

    return app


def test_not_given_keeps_every_field_default():
    got: dict[str, object] = {}
    r = CliRunner().invoke(_app(got), [])
    assert r.exit_code == 0, r.output
    assert got == {"n": 1, "confirm": Confirmation(), "capacity": CapacitySearch(),
                   "quality": QualityGate(), "fleet": Fleet()}


def test_each_option_reaches_its_field():
    got: dict[str, object] = {}
    args = ["--n", "2", "--confirm-top", "0", "--capacity-window", "5",
            "--lossy", "--max-quality-loss", "0.05", "--heartbeat", "7", "--finish",
            "--gpus", "0,1"]
    r = CliRunner().invoke(_app(got), args)
    assert r.exit_code == 0, r.output
    assert got["n"] == 2
    # --confirm-top given: the confirmation is fixed, not sized to a budget
    assert got["confirm"] == Confirmation(top=0, repeats=2, fixed=True)
    assert got["capacity"] == CapacitySearch(window=5.0)
    assert got["quality"] == QualityGate(lossy=True, max_loss=0.05)
    assert got["fleet"] == Fleet(gpus="0,1", finish=True, heartbeat_s=7)


def test_a_bound_is_the_command_lines():
    r = CliRunner().invoke(_app({}), ["--confirm-repeats", "0"])
    assert r.exit_code == 2 and "--confirm-repeats" in r.output


def test_grouped_speaks_in_flag_names():
    assert grouped({"trials": 3, "confirm_top": 0, "heartbeat": 2}) == {
        "trials": 3, "confirm": Confirmation(top=0, fixed=True), "fleet": Fleet(heartbeat_s=2)}
    assert grouped({"trials": 3}) == {"trials": 3}


def test_every_group_field_is_an_option_or_derived():
    """A field without an option is one the group derives (Confirmation.
    fixed: were its sizes given?); every option has a flag and help."""
    for group in GROUPS.values():
        options = {f.name for f in cli_fields(group)}
        derived = {f.name for f in dataclasses.fields(group)} - options  # type: ignore[arg-type]
        assert derived <= {"fixed"}, (group, derived)
        for f in cli_fields(group):
            assert f.metadata["flag"] == "--" + cli_name(f).replace("_", "-")
            assert f.metadata["help"]
