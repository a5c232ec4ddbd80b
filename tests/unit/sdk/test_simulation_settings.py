"""Which world a process simulates: tessel's launcher variables, else MindSpore's MS_SIMULATION_LEVEL, RANK_ID and
RANK_SIZE (as MindSpore's dry runs set them)."""

from __future__ import annotations

import pytest

from tessel.communication import simulation
from tessel.core.errors import ConfigurationError, NotSupportedYetError

VARIABLES = ("TESSEL_SIM_LEVEL", "TESSEL_SIM_RANK", "TESSEL_SIM_WORLD", "MS_SIMULATION_LEVEL", "RANK_ID", "RANK_SIZE")
LAUNCHERS = ("TESSEL_RANK", "TESSEL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE")


@pytest.fixture
def env(monkeypatch):
    for name in VARIABLES + LAUNCHERS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_no_variable_is_no_simulation(env):
    assert simulation.settings() is None
    env.setenv("RANK_SIZE", "8")  # a rank table's variables alone simulate nothing
    assert simulation.settings() is None


def test_mindspores_variables(env):
    env.setenv("MS_SIMULATION_LEVEL", "0")
    assert simulation.settings() == (0, 0, 1)  # MindSpore's defaults: RANK_ID 0, RANK_SIZE 1
    env.setenv("RANK_SIZE", "64")
    env.setenv("RANK_ID", " 17 ")
    assert simulation.settings() == (0, 17, 64)


def test_under_mpirun_each_process_simulates_its_own_rank(env):
    env.setenv("MS_SIMULATION_LEVEL", "0")
    env.setenv("RANK_ID", "5")  # a leftover of another launcher: mpirun's variables name this process
    env.setenv("OMPI_COMM_WORLD_RANK", "2")
    env.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert simulation.settings() == (0, 2, 4)


def test_tessels_launcher_variables_come_first(env):
    env.setenv("MS_SIMULATION_LEVEL", "0")
    env.setenv("RANK_SIZE", "64")
    env.setenv("TESSEL_SIM_LEVEL", "0")
    env.setenv("TESSEL_SIM_RANK", "2")
    env.setenv("TESSEL_SIM_WORLD", "4")
    assert simulation.settings() == (0, 2, 4)


@pytest.mark.parametrize(
    ("given", "error", "message"),
    [
        ({"MS_SIMULATION_LEVEL": "1"}, NotSupportedYetError, r"simulation level 1 \(MS_SIMULATION_LEVEL=1\)"),
        ({"MS_SIMULATION_LEVEL": "3", "RANK_SIZE": "8"}, NotSupportedYetError, "only level so far"),
        ({"MS_SIMULATION_LEVEL": "zero"}, ConfigurationError, "MS_SIMULATION_LEVEL='zero'.*needs integers"),
        ({"MS_SIMULATION_LEVEL": "0", "RANK_SIZE": "8", "RANK_ID": "8"}, ConfigurationError, r"RANK_ID=8 .*\(0..7\)"),
        ({"TESSEL_SIM_LEVEL": "0"}, ConfigurationError, "TESSEL_SIM_WORLD=None.*tessel run --sim-level 0"),
    ],
)
def test_bad_settings_are_named(env, given, error, message):
    for name, value in given.items():
        env.setenv(name, value)
    with pytest.raises(error, match=message):
        simulation.settings()
