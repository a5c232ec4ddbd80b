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
from tessel.compiler.pipeline.schedule import Action, Message, Op, Schedule, Transfers
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


def check(schedule: Schedule, transfers: Transfers | None = None) -> Timing:
    """Run `schedule` (moving `transfers`, default a plain chain of stages) dry on every stage (see the module
    docstring); returns its unit-cost timing."""
    return simulate_schedule(schedule, transfers=transfers)


def simulate_schedule(
    schedule: Schedule,
    costs: dict[str, float] | None = None,
    transfers: Transfers | None = None,
    timed: dict[str, float] | None = None,
) -> Timing:
    """Run `schedule` dry in the rank simulator; `costs` gives the units of "F", "B" and "W" (default 1 each, 2
    for a backward that is not split); `timed` instead gives each action's own time, by its name ("B(v=1,m=3)": a
    timeline's measured durations; an action it lacks takes none, as a first stage's empty input gradient)."""
    transfers = transfers if transfers is not None else Transfers.chain(schedule.virtual_stages)
    unit = {"F": 1.0, "B": 1.0 if schedule.split_backward else 2.0, "W": 1.0, **(costs or {})}
    programs = [skeleton(schedule, s, transfers) for s in range(schedule.stages)]
    seconds = {name: unit.get(name[0], 0.0) for program in programs for name in program.segments}
    if timed is not None:
        seconds = {name: timed.get(name, 0.0) if name[:2] in ("F(", "B(", "W(") else 0.0 for name in seconds}
    world = World(programs, None, seconds)
    try:
        world.run([{} for _ in programs])
    except ConfigurationError as err:
        said = str(err).replace("rank ", "stage ")
        raise ConfigurationError(
            f"pipeline schedule {schedule.name!r} ({schedule.stages} stages, {schedule.virtual} chunks each, "
            f"{schedule.micro} micro-batches) is wrong: {said}. Stages run, in order:\n{schedule.describe()}"
        ) from None
    return Timing(max(world.clocks), tuple(world.busy))


def _names(schedule: Schedule, action: Action, transfers: Transfers, kind: str, incoming: bool) -> list[str]:
    """The tensors of `action`'s links: for an F its activations in (incoming) or out, for a B its gradients."""
    out = []
    for link in transfers.links:
        if kind == "act" and (link.target if incoming else link.source) == action.stage:
            out += [Message("act", link.source, link.target, action.micro, i).name for i in range(link.forward)]
        if kind == "grad" and (link.source if incoming else link.target) == action.stage:
            out += [Message("grad", link.source, link.target, action.micro, i).name for i in range(link.backward)]
    return out


def _reads(schedule: Schedule, action: Action, transfers: Transfers) -> list[str]:
    """What an action needs besides its stage's parameters: the incoming activations or gradients (received or
    made on this stage) and, for a backward, its own forward (and for W, its own B)."""
    if action.kind == "F":
        return _names(schedule, action, transfers, "act", incoming=True)
    if action.kind == "B":
        return [repr(Action("F", action.stage, action.micro)), *_names(schedule, action, transfers, "grad", True)]
    return [repr(Action("B", action.stage, action.micro))]


def _writes(schedule: Schedule, action: Action, transfers: Transfers) -> list[str]:
    made = [repr(action)]
    if action.kind == "F":
        made += _names(schedule, action, transfers, "act", incoming=False)
    if action.kind == "B":
        made += _names(schedule, action, transfers, "grad", incoming=False)
    return made


def skeleton(schedule: Schedule, physical: int, transfers: Transfers | None = None) -> RankProgram:
    """The rank program stage `physical` runs, with a named empty segment per compute action (reads: what the
    action needs; outputs: what it makes) and a pair group per direction of transfer."""
    transfers = transfers if transfers is not None else Transfers.chain(schedule.virtual_stages)
    segments: dict[str, RankSegment] = {}
    groups: dict[str, tuple[int, ...]] = {}
    instructions: list[daemon_pb2.Instruction] = []
    sends: list[str] = []

    def segment(name: str, reads: list[str], writes: list[str]) -> daemon_pb2.Instruction:
        graph = Graph(tuple(new_value((), "float32", r) for r in reads), (), (), "dry")
        segments[name] = RankSegment(name, graph, b"", (), tuple(writes))
        return daemon_pb2.Instruction(run_segment=daemon_pb2.RunSegment(segment=name))

    results = [op.message.name for op in schedule.rank_ops(physical, transfers) if op.kind == "send"]
    results = [name for name in results if name.startswith("out(")]
    for op in schedule.rank_ops(physical, transfers):
        if op.kind == "compute":
            a = op.action
            instructions.append(segment(repr(a), _reads(schedule, a, transfers), _writes(schedule, a, transfers)))
            continue
        if op.kind == "sync":
            name = f"sync{op.group}"
            group = group_name(op.group, None)
            groups[group] = op.group
            instructions.append(segment(f"grad {name}", [], [name]))
            reduce = daemon_pb2.CollectiveOp(kind=collective_pb2.ALL_REDUCE, group=group, inputs=[name], outputs=[name])
            instructions.append(daemon_pb2.Instruction(collective=reduce))
            continue
        if op.kind == "send" and op.message.name == (results[0] if results else None):
            instructions.append(segment(f"results(stage={physical})", [], results))
        instructions += _transfer(physical, op, groups, sends)
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


def _transfer(physical: int, op: Op, groups, sends) -> list:
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


def shared_cores_bubble(schedule: Schedule, cores: int, costs: dict[str, float] | None = None) -> float:
    """The bubble `schedule` gets from a perfect runtime (free transfers and dispatch, unit costs as
    `simulate_schedule`) when its stages share `cores` cores equally: while n stages compute, each runs at
    min(1, cores / n) of a core. Measured as the benchmark measures it: 1 - (wall time the stages spend in their
    actions) / (stages x the window from the first action to the last). With a core per stage it is the unit-cost
    bubble; with fewer cores an action that waits for a core still counts as computing, as it does on a timeline."""
    if cores < 1:
        raise ConfigurationError(f"shared_cores_bubble: cores must be >= 1, got {cores!r}")
    unit = {"F": 1.0, "B": 1.0 if schedule.split_backward else 2.0, "W": 1.0, **(costs or {})}
    stages = schedule.stages
    orders = [list(order) for order in schedule.orders]
    placement = {v: schedule.placement(v) for v in range(schedule.virtual_stages)}
    last = schedule.virtual_stages - 1
    done: set[Action] = set()
    position = [0] * stages
    running: list[tuple[Action, float] | None] = [None] * stages  # (action, work left)
    busy = [0.0] * stages
    clock = 0.0

    def ready(action: Action) -> bool:
        v, m = action.stage, action.micro
        if action.kind == "F":
            return v == 0 or Action("F", v - 1, m) in done
        if action.kind == "B":
            return Action("F", v, m) in done and (v == last or Action("B", v + 1, m) in done)
        return Action("B", v, m) in done

    while True:
        for s in range(stages):
            if running[s] is None and position[s] < len(orders[s]) and ready(orders[s][position[s]]):
                action = orders[s][position[s]]
                running[s] = (action, unit[action.kind])
                position[s] += 1
        active = [s for s in range(stages) if running[s] is not None]
        if not active:
            if any(position[s] < len(orders[s]) for s in range(stages)):  # pragma: no cover - check() catches it
                raise ConfigurationError(f"pipeline schedule {schedule.name!r} deadlocks in shared_cores_bubble")
            break
        rate = min(1.0, cores / len(active))
        step = min(running[s][1] for s in active) / rate
        clock += step
        for s in active:
            action, left = running[s]
            busy[placement[action.stage]] += step
            left -= step * rate
            if left <= 1e-12:
                done.add(action)
                running[s] = None
            else:
                running[s] = (action, left)
    return 1.0 - sum(busy) / (stages * clock)
