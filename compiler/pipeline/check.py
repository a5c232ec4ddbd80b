"""Checking a pipeline schedule before any rank runs: every stage's ops (Schedule.rank_ops) become the rank
program they stand for — receives posted with a handle, waits, one segment per compute action, sends with a
handle waited at the end — and the whole world runs dry in the rank simulator (compiler/rank_simulator.py). A
schedule that would deadlock, an action that needs something its own stage makes only later, a send without its
receive or two stages whose transfer orders disagree is a ConfigurationError naming the schedule, the stages and
the actions; it never reaches a daemon.

With unit costs (F, B and W one unit each, an unsplit backward two) the same run times the schedule:
`simulate_schedule(schedule).bubble` is the idle share of the average stage, the figure schedules are compared by.

    check(generate("1f1b", stages=4, micro=8))          # raises if the schedule is wrong
    simulate_schedule(generate("gpipe", 4, 8)).bubble   # 3/11
"""

from __future__ import annotations

from dataclasses import dataclass

from tessel.compiler.ir import Graph, new_value
from tessel.compiler.pipeline.schedule import Action, Op, Schedule
from tessel.compiler.rank_program import RankProgram, RankSegment, group_name
from tessel.compiler.rank_simulator import World
from tessel.core.errors import ConfigurationError
from tessel.v1 import collective_pb2, daemon_pb2


@dataclass(frozen=True)
class Timing:
    """A dry run's clock: the step's length and each stage's compute time, in units of one forward."""

    makespan: float
    busy: tuple[float, ...]

    @property
    def bubble(self) -> float:
        """The idle share of the average stage: 1 - compute / (stages x makespan)."""
        return 1.0 - sum(self.busy) / (len(self.busy) * self.makespan)


def check(schedule: Schedule) -> Timing:
    """Run `schedule` dry on every stage (see the module docstring); returns its unit-cost timing."""
    return simulate_schedule(schedule)


def simulate_schedule(schedule: Schedule, costs: dict[str, float] | None = None) -> Timing:
    """Run `schedule` dry in the rank simulator; `costs` gives the units of "F", "B" and "W" (default 1 each, 2
    for a backward that is not split)."""
    unit = {"F": 1.0, "B": 1.0 if schedule.split_backward else 2.0, "W": 1.0, **(costs or {})}
    programs = [skeleton(schedule, s) for s in range(schedule.stages)]
    seconds = {name: unit[name[0]] for program in programs for name in program.segments}
    world = World(programs, None, seconds)
    try:
        world.run([{} for _ in programs])
    except ConfigurationError as err:
        raise ConfigurationError(
            f"pipeline schedule {schedule.name!r} ({schedule.stages} stages, {schedule.virtual} chunks each, "
            f"{schedule.micro} micro-batches) is wrong: {err}. Stages run, in order:\n{schedule.describe()}"
        ) from None
    return Timing(max(world.clocks), tuple(world.busy))


def _segment_name(action: Action) -> str:
    return repr(action)


def _reads(schedule: Schedule, action: Action) -> list[str]:
    """What an action needs besides its stage's parameters: the incoming activation or gradient (received or
    made on this stage) and, for a backward, its own forward (and for W, its own B)."""
    last = schedule.virtual_stages - 1
    if action.kind == "F":
        return [f"act(v={action.stage - 1},m={action.micro})"] if action.stage > 0 else []
    if action.kind == "B":
        reads = [_segment_name(Action("F", action.stage, action.micro))]
        if action.stage < last:
            reads.append(f"grad(v={action.stage + 1},m={action.micro})")
        return reads
    return [_segment_name(Action("B", action.stage, action.micro))]


def _writes(action: Action) -> list[str]:
    made = [_segment_name(action)]
    if action.kind == "F":
        made.append(f"act(v={action.stage},m={action.micro})")
    if action.kind == "B":
        made.append(f"grad(v={action.stage},m={action.micro})")
    return made


def skeleton(schedule: Schedule, physical: int) -> RankProgram:
    """The rank program stage `physical` runs, with a named empty segment per compute action (reads: what the
    action needs; outputs: what it makes) and a pair group per direction of transfer."""
    segments: dict[str, RankSegment] = {}
    groups: dict[str, tuple[int, ...]] = {}
    instructions: list[daemon_pb2.Instruction] = []
    sends: list[str] = []
    for index, op in enumerate(schedule.rank_ops(physical)):
        instructions += _instructions(schedule, physical, op, index, segments, groups, sends)
    instructions += [daemon_pb2.Instruction(wait=daemon_pb2.WaitOp(handle=h)) for h in sends]
    return RankProgram(
        name=f"{schedule.name}/stage{physical}",
        segments=segments,
        program=daemon_pb2.Program(instructions=instructions),
        groups=groups,
        data_inputs=(),
        state_inputs=(),
        outputs=(),
    )


def transfer_group(source: int, target: int) -> tuple[int, int]:
    """The group a transfer from `source` to `target` travels in: one per direction, sender first (so the two
    directions between two stages never queue behind each other)."""
    return (source, target)


def _instructions(schedule, physical: int, op: Op, index: int, segments, groups, sends) -> list:
    if op.kind == "compute":
        name = _segment_name(op.action)
        graph = Graph(tuple(new_value((), "float32", r) for r in _reads(schedule, op.action)), (), (), "dry")
        segments[name] = RankSegment(name, graph, b"", (), tuple(_writes(op.action)))
        return [daemon_pb2.Instruction(run_segment=daemon_pb2.RunSegment(segment=name))]
    message = op.message.name
    handle = f"{op.kind}:{message}"
    if op.kind == "wait":
        return [daemon_pb2.Instruction(wait=daemon_pb2.WaitOp(handle=f"recv:{message}"))]
    pair = transfer_group(physical, op.peer) if op.kind == "send" else transfer_group(op.peer, physical)
    group = group_name(pair, None)
    groups[group] = pair
    if op.kind == "send":
        sends.append(handle)
        collective = daemon_pb2.CollectiveOp(kind=collective_pb2.SEND, group=group, inputs=[message], peer=1)
    else:
        shape = daemon_pb2.TensorShape(dims=[])
        collective = daemon_pb2.CollectiveOp(
            kind=collective_pb2.RECV, group=group, outputs=[message], peer=0, recv_shapes=[shape]
        )
    collective.handle = handle
    return [daemon_pb2.Instruction(collective=collective)]
