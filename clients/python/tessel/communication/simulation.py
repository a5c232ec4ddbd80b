"""Planning a world that is not running (msrun's `--sim_level 0`): `tessel run --sim-level 0 -n 64 train.py`, or
MindSpore's environment variables `MS_SIMULATION_LEVEL=0 RANK_SIZE=64 RANK_ID=3 python train.py`.

The script runs once, as rank `--sim-rank-id` (default 0) of a world of `-n` ranks, on an in-process daemon: it
traces, plans (SEMI_AUTO strategies or AUTO_PARALLEL's search, for the whole world), lowers and compiles this
rank's programs, writing the strategy file (strategy_ckpt_config) and the save_graphs output as a real job would.
No collective runs and no other rank exists: at the first run of a compiled program the simulation is complete
and the process exits 0, saying what it did.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from tessel.communication.daemon_handle import LocalDaemon
from tessel.core.errors import ConfigurationError

SIM_LEVEL, SIM_RANK, SIM_WORLD = "TESSEL_SIM_LEVEL", "TESSEL_SIM_RANK", "TESSEL_SIM_WORLD"
MS_LEVEL = "MS_SIMULATION_LEVEL"  # MindSpore's: with RANK_SIZE (the world, default 1) and RANK_ID (default 0)


class SimulationComplete(SystemExit):
    """Raised at the first run of a compiled program in a simulated world: planning and compiling are done."""

    def __init__(self, rank: int, world: int, compiled: int):
        super().__init__(0)
        self.rank, self.world, self.compiled = rank, world, compiled


# Where a process under MS_SIMULATION_LEVEL finds its rank and world: a launcher's variables (mpirun: each process
# simulates its own rank), else MindSpore's RANK_ID / RANK_SIZE.
_RANK_AND_WORLD = (
    ("TESSEL_RANK", "TESSEL_WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("RANK_ID", "RANK_SIZE"),
)


def settings() -> tuple[int, int, int] | None:
    """(level, rank, world) when this process simulates a world, else None: from the variables tessel's launchers
    set (`tessel run --sim-level`, `tessel msrun --sim_level`, or MS_SIMULATION_LEVEL given to either), else from
    MindSpore's MS_SIMULATION_LEVEL with the rank and world of the process's launcher (mpirun's), or RANK_ID
    (default 0) and RANK_SIZE (default 1)."""
    if os.environ.get(SIM_LEVEL, ""):
        return _checked((SIM_LEVEL, SIM_RANK, SIM_WORLD), None, "tessel run --sim-level 0 -n N script.py")
    if os.environ.get(MS_LEVEL, "").strip():
        rank, world = next(pair for pair in _RANK_AND_WORLD if pair[0] in os.environ or pair[0] == "RANK_ID")
        return _checked((MS_LEVEL, rank, world), "1", f"{MS_LEVEL}=0 RANK_SIZE=64 RANK_ID=3 python train.py")
    return None


def _checked(names: tuple[str, str, str], world_default: str | None, example: str) -> tuple[int, int, int]:
    level_name, rank_name, world_name = names
    given = {name: os.environ.get(name, default) for name, default in zip(names, (None, "0", world_default))}
    try:
        level, rank, world = (int(given[name].strip()) for name in names)
    except (AttributeError, ValueError):
        shown = ", ".join(f"{name}={value!r}" for name, value in given.items())
        raise ConfigurationError(f"{shown}: a simulation needs integers; e.g. `{example}`") from None
    if level != 0:
        from tessel.common.support import not_supported_yet

        raise not_supported_yet(
            f"simulation level {level} ({level_name}={level})",
            "level 0 (plan and compile one rank; no memory statistics, no kernels) is the only level so far",
        )
    if world < 1 or not 0 <= rank < world:
        raise ConfigurationError(
            f"{rank_name}={rank} must be a rank of the {world_name}={world} world (0..{world - 1}); e.g. `{example}`"
        )
    return level, rank, world


class SimulatedDaemon(LocalDaemon):
    """An in-process daemon that compiles what it is given and stops the process at the first run."""

    def __init__(self, core, rank: int, world: int):
        super().__init__(core)
        self.rank, self.world, self.compiled = rank, world, 0

    def create_group(self, session_id: str, name: str, ranks: Sequence[int]) -> None:
        """Groups of the simulated world have no other member here: nothing to set up."""

    def destroy_group(self, session_id: str, name: str) -> None:
        """See create_group."""

    def compile_segment(self, session_id: str, name: str, onnx_model: bytes, state: Sequence[str] = ()) -> None:
        super().compile_segment(session_id, name, onnx_model, state)
        self.compiled += 1

    def execute(
        self, session_id, program, repeat=1, fetch=(), timings=False, feed=None, collect=(), per_repetition=None
    ):
        print(
            f"tessel simulation (sim level 0): rank {self.rank} of a {self.world}-rank world planned and compiled "
            f"{self.compiled} segment(s); stopping before the first run",
            flush=True,
        )
        sys.stdout.flush()
        raise SimulationComplete(self.rank, self.world, self.compiled)
