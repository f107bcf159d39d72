"""The I/O engine room: every list of engines comes from its registry, and auto follows its order."""

from __future__ import annotations

import typing

import click
import pytest

from hpcrun.cli import main
from hpcrun.iotune.engines import engine_for, names
from hpcrun.iotune.sweeps.plan import choose_engine
from hpcrun.iotune.sweeps.sweep import Sweep
from hpcrun.model.profiles import load_profile


def test_choices_follow_the_registry():
    assert names() == ["ior", "fio"]
    field = Sweep.model_fields["engine"].annotation
    assert list(typing.get_args(field)) == ["auto", *names()]
    group = main.commands["iotune"]
    run = group.get_command(click.Context(group), "run")   # registered when the group is first used
    assert run is not None
    option = next(p for p in run.params if p.name == "engine")
    assert isinstance(option.type, click.Choice) and list(option.type.choices) == ["auto", *names()]


def test_auto_takes_the_first_engine_present(monkeypatch):
    profile = load_profile("local-test").profile
    monkeypatch.setattr("shutil.which", lambda name: None)
    no_ior = profile.model_copy(update={"tools": profile.tools.model_copy(update={"ior": None, "ior_module": None})})
    assert choose_engine(Sweep(transfer_sizes=[2**20]), no_ior) == ("fio", no_ior.iotune.fio)
    with_ior = profile.model_copy(update={"tools": profile.tools.model_copy(update={"ior": "/opt/ior/bin/ior"})})
    assert choose_engine(Sweep(transfer_sizes=[2**20]), with_ior) == ("ior", "/opt/ior/bin/ior")
    assert choose_engine(Sweep(transfer_sizes=[2**20], engine="fio"), with_ior)[0] == "fio"


def test_each_engine_refuses_what_it_cannot_measure():
    fio = engine_for("fio")
    assert "':'" in fio.path_problem("/a:b") and fio.path_problem("/a/b") == ""
    two_nodes = Sweep(transfer_sizes=[2**20], nodes=[2], engine="auto")
    with pytest.raises(ValueError, match="one node"):
        fio.check_sweep(two_nodes)
    engine_for("ior").check_sweep(two_nodes)   # IOR runs on several nodes
