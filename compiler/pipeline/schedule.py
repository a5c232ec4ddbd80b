"""Pipeline schedules: which compute action each stage runs when, for every stage, generated in one place.

A network cut into `stages` physical stages (ranks of the pipeline dimension) and `virtual` chunks per stage runs
`micro` micro-batches. Virtual stage v (0 .. stages * virtual - 1) is the v-th piece of the network in execution
order; it lives on physical stage `placement(v)`. Each micro-batch m passes every virtual stage forward, F(v, m),
then backward in reverse, B(v, m). A zero-bubble schedule splits the backward in two: B(v, m) computes the
gradient with respect to the stage's inputs (what the previous stage waits for) and W(v, m) the gradient with
respect to its parameters (which nobody waits for, so it can fill the gaps).

    schedule = generate("1f1b", stages=4, micro=8)
    schedule.orders[1]        # (F(v=0,m=0) ... ): stage 1's actions in run order
    schedule.theory_bubble()  # (S-1)/(M+S-1) for GPipe and 1F1B, /V for interleaved 1F1B

The schedules (names as MindSpore's pipeline_scheduler where MindSpore has one):
- "gpipe": every forward, then every backward (breadth-first over the chunks when virtual > 1);
- "1f1b": stage s runs S-s-1 forwards, then alternates one forward, one backward, then drains the backwards;
  with virtual > 1 it is Megatron's interleaved 1F1B (micro-batches in groups of S, chunk by chunk);
- "zero_bubble_h1": 1F1B with the backward split (ZB-H1 of Qi et al., "Zero Bubble Pipeline Parallelism", 2024):
  a stage runs a W only where it would otherwise wait, so the gradients reach the first stage sooner and the W's
  fill what 1F1B leaves idle, with no stage holding more micro-batches than 1F1B's first stage (S).

What moves between stages, and when each stage posts and waits for it, is `rank_ops`; `check` (compiler/pipeline/
check.py) runs every stage's ops through the rank simulator before any rank runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessel.core.errors import ConfigurationError

SCHEDULERS = ("gpipe", "1f1b", "zero_bubble_h1")


@dataclass(frozen=True, order=True)
class Action:
    """One compute action: kind "F" (forward), "B" (backward; only the input gradient when the schedule splits
    the backward) or "W" (the parameter gradient of a split backward), of virtual stage `stage`, micro-batch
    `micro`."""

    kind: str
    stage: int
    micro: int

    def __repr__(self) -> str:
        return f"{self.kind}(v={self.stage},m={self.micro})"


@dataclass(frozen=True)
class Link:
    """Tensors that cross, for every micro-batch, from virtual stage `source` to the later virtual stage `target`:
    `forward` activations made by F(source, m) for F(target, m), and `backward` gradients made by B(target, m) for
    B(source, m) (a tensor with no gradient, such as integer labels, crosses forward only)."""

    source: int
    target: int
    forward: int = 1
    backward: int = 1


@dataclass(frozen=True)
class Transfers:
    """Everything a network sends between stages: its links, the step results each physical stage sends every
    other one at the end (`results`: stage -> how many tensors, the loss for the ranks that do not compute it),
    and the groups of physical stages that sum a shared parameter's gradient (`syncs`, in one order for all)."""

    links: tuple[Link, ...]
    results: tuple[tuple[int, int], ...] = ()
    syncs: tuple[tuple[int, ...], ...] = ()

    @staticmethod
    def chain(virtual_stages: int) -> Transfers:
        """One activation and one gradient between consecutive virtual stages (a plain chain of stages)."""
        return Transfers(tuple(Link(v, v + 1) for v in range(virtual_stages - 1)))


@dataclass(frozen=True)
class Message:
    """One tensor one physical stage sends another: "act" (made by F(source, micro) for F(target, micro)),
    "grad" (made by B(target, micro) for B(source, micro)) or "out" (a step result of physical stage `source`);
    `index` numbers the tensors of one link and micro-batch."""

    kind: str
    source: int
    target: int
    micro: int
    index: int = 0

    @property
    def name(self) -> str:
        if self.kind == "out":
            return f"out(stage={self.source}->{self.target})#{self.index}"
        return f"{self.kind}(v={self.source}->{self.target},m={self.micro})#{self.index}"

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Op:
    """One step of a stage's run: "recv" (post the receive of `message` from `peer`, asynchronously), "wait"
    (block until that receive is in), "compute" (`action`), "send" (start sending `message` to `peer`,
    asynchronously; every send is waited for at the end of the step), "sync" (sum a shared parameter's gradient
    over the physical stages `group`)."""

    kind: str
    action: Action | None = None
    message: Message | None = None
    peer: int = -1
    group: tuple[int, ...] = ()

    def __repr__(self) -> str:
        if self.kind == "compute":
            return repr(self.action)
        if self.kind == "sync":
            return f"sync over stages {self.group}"
        where = "from" if self.kind in ("recv", "wait") else "to"
        return f"{self.kind} {self.message} {where} stage {self.peer}"


@dataclass(frozen=True)
class Schedule:
    """Every stage's actions in run order (see the module docstring)."""

    name: str
    stages: int
    virtual: int
    micro: int
    split_backward: bool
    orders: tuple[tuple[Action, ...], ...]

    @property
    def virtual_stages(self) -> int:
        return self.stages * self.virtual

    def placement(self, stage: int) -> int:
        """The physical stage virtual stage `stage` runs on (chunk c of stage s is virtual stage c*S + s)."""
        return stage % self.stages

    def chunks(self, physical: int) -> tuple[int, ...]:
        """The virtual stages physical stage `physical` runs, in execution order."""
        return tuple(v for v in range(self.virtual_stages) if self.placement(v) == physical)

    def theory_bubble(self) -> float:
        """The idle share of a stage with equal forward and backward times and free transfers: (S-1)/(M+S-1) for
        GPipe and 1F1B, (S-1)/(V*M+S-1) for interleaved 1F1B (the 1F1B bubble divided by about V), and for the
        zero-bubble schedule the share its own simulation gives with B = W = F (see `simulated_bubble`)."""
        s, m, v = self.stages, self.micro, self.virtual
        if self.name == "zero_bubble_h1":
            return self.simulated_bubble()
        if self.name == "1f1b" and v > 1:
            return (s - 1) / (v * m + s - 1)
        return (s - 1) / (m + s - 1)

    def simulated_bubble(self) -> float:
        """The idle share the rank simulator finds for this schedule when F, B and W all take one unit (an unsplit
        backward two) and transfers are free."""
        from tessel.compiler.pipeline.check import simulate_schedule

        return simulate_schedule(self).bubble

    def messages_in(self, physical: int, action: Action, transfers: Transfers) -> list[tuple[Message, int]]:
        """The messages `action` needs from other stages, with the stage each comes from."""
        out = []
        for link in transfers.links:
            if action.kind == "F" and link.target == action.stage:
                source = self.placement(link.source)
                count = link.forward
                out += [(Message("act", link.source, link.target, action.micro, i), source) for i in range(count)]
            if action.kind == "B" and link.source == action.stage:
                source = self.placement(link.target)
                out += [
                    (Message("grad", link.source, link.target, action.micro, i), source) for i in range(link.backward)
                ]
        return [(message, source) for message, source in out if source != physical]

    def messages_out(self, physical: int, action: Action, transfers: Transfers) -> list[tuple[Message, int]]:
        """The messages `action` produces for other stages, with the stage each goes to."""
        out = []
        for link in transfers.links:
            if action.kind == "F" and link.source == action.stage:
                target = self.placement(link.target)
                count = link.forward
                out += [(Message("act", link.source, link.target, action.micro, i), target) for i in range(count)]
            if action.kind == "B" and link.target == action.stage:
                target = self.placement(link.source)
                out += [
                    (Message("grad", link.source, link.target, action.micro, i), target) for i in range(link.backward)
                ]
        return [(message, target) for message, target in out if target != physical]

    def _sends(self, physical: int, transfers: Transfers) -> list[tuple[Message, int]]:
        """What stage `physical` sends, in the order it sends it."""
        sends = [m for a in self.orders[physical] for m in self.messages_out(physical, a, transfers)]
        for source, count in transfers.results:
            if source == physical:
                for target in range(self.stages):
                    if target != physical:
                        sends += [(Message("out", source, target, 0, i), target) for i in range(count)]
        return sends

    def rank_ops(self, physical: int, transfers: Transfers | None = None) -> list[Op]:
        """What stage `physical` runs in one step: it posts every receive first, in the order each sender sends
        (transfers between two stages travel in order on one channel per direction), then for each action waits
        for what the action needs, runs it and starts sending what it made; at the end it sums shared gradients
        (`syncs`) and sends its step results. A stage thus computes while the transfers it posted or started are
        in flight."""
        transfers = transfers if transfers is not None else Transfers.chain(self.virtual_stages)
        ops: list[Op] = []
        for source in range(self.stages):
            if source != physical:
                ops += [Op("recv", message=m, peer=source) for m, t in self._sends(source, transfers) if t == physical]
        for action in self.orders[physical]:
            ops += [Op("wait", message=m, peer=p) for m, p in self.messages_in(physical, action, transfers)]
            ops.append(Op("compute", action=action))
            ops += [Op("send", message=m, peer=p) for m, p in self.messages_out(physical, action, transfers)]
        ops += [Op("sync", group=group) for group in transfers.syncs if physical in group]
        ops += [Op("send", message=m, peer=p) for m, p in self._sends(physical, transfers) if m.kind == "out"]
        results = [op for op in ops if op.kind == "recv" and op.message.kind == "out"]
        ops += [Op("wait", message=op.message, peer=op.peer) for op in results]
        return ops

    def describe(self) -> str:
        """One line per stage, the actions in run order."""
        head = f"{self.name}: {self.stages} stages x {self.virtual} chunks, {self.micro} micro-batches"
        return "\n".join([head, *(f"  stage {s}: {' '.join(map(repr, o))}" for s, o in enumerate(self.orders))])


def generate(scheduler: str, stages: int, micro: int, virtual: int = 1, forward_only: bool = False) -> Schedule:
    """The schedule `scheduler` for `stages` physical stages with `virtual` chunks each and `micro` micro-batches;
    invalid combinations are errors naming the rule and a fix. `forward_only`: a step without gradients (inference),
    which runs with fewer micro-batches than stages too (one stage after the other)."""
    _check(scheduler, stages, micro, virtual, forward_only)
    if scheduler == "gpipe":
        orders = [_gpipe(stages, micro, virtual, s) for s in range(stages)]
    elif scheduler == "1f1b" and virtual == 1:
        orders = [_one_f_one_b(stages, micro, s) for s in range(stages)]
    elif scheduler == "1f1b":
        orders = [_interleaved(stages, micro, virtual, s) for s in range(stages)]
    else:
        orders = _zero_bubble_h1(stages, micro)
    split = scheduler == "zero_bubble_h1"
    return Schedule(scheduler, stages, virtual, micro, split, tuple(tuple(o) for o in orders))


def _check(scheduler: str, stages: int, micro: int, virtual: int, forward_only: bool = False) -> None:
    for name, value in (("stages", stages), ("micro_size", micro), ("virtual chunks", virtual)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"pipeline schedule: {name} must be an int >= 1, got {value!r}")
    if scheduler not in SCHEDULERS:
        raise ConfigurationError(
            f"pipeline_scheduler {scheduler!r} is not one of {list(SCHEDULERS)}; the rule: a schedule tessel can "
            "generate and check. Fix: pick one of them"
        )
    if micro < stages and not forward_only:
        raise ConfigurationError(
            f"micro_size {micro} is smaller than pipeline_stages {stages}; the rule: micro_size >= stages (every "
            f"stage needs a micro-batch to work on while the pipeline fills). Fix: micro_size >= {stages}, e.g. "
            f"PipelineCell(net, {stages})"
        )
    if virtual > 1 and scheduler == "zero_bubble_h1":
        raise ConfigurationError(
            "pipeline_scheduler 'zero_bubble_h1' runs one chunk per stage; the rule: pipeline_interleave=False "
            "with it (the network's pipeline_stage numbers must not wrap round). Fix: set pipeline_interleave "
            "False, or use '1f1b' for interleaved chunks"
        )
    if virtual > 1 and scheduler == "1f1b" and micro % stages and not forward_only:
        raise ConfigurationError(
            f"interleaved 1F1B runs micro-batches in groups of pipeline_stages: micro_size {micro} is not a "
            f"multiple of {stages}. Fix: micro_size a multiple of {stages} (e.g. {stages * -(-micro // stages)})"
        )


def _gpipe(stages: int, micro: int, virtual: int, s: int) -> list[Action]:
    chunks = [c * stages + s for c in range(virtual)]
    forward = [Action("F", v, m) for v in chunks for m in range(micro)]
    backward = [Action("B", v, m) for v in reversed(chunks) for m in range(micro)]
    return forward + backward


def _one_f_one_b(stages: int, micro: int, s: int) -> list[Action]:
    warmup = min(stages - s - 1, micro)
    order = [Action("F", s, m) for m in range(warmup)]
    for i in range(micro - warmup):
        order += [Action("F", s, warmup + i), Action("B", s, i)]
    order += [Action("B", s, m) for m in range(micro - warmup, micro)]
    return order


def _interleaved(stages: int, micro: int, virtual: int, s: int) -> list[Action]:
    """Megatron's interleaved 1F1B: the k-th forward of a stage is chunk (k // S) % V of micro-batch
    (k // (S V)) S + k % S; backwards run the chunks in reverse."""
    total = micro * virtual

    def micro_of(k: int) -> int:
        return (k // (stages * virtual)) * stages + k % stages

    def forward(k: int) -> Action:
        return Action("F", ((k // stages) % virtual) * stages + s, micro_of(k))

    def backward(k: int) -> Action:
        return Action("B", (virtual - 1 - (k // stages) % virtual) * stages + s, micro_of(k))

    warmup = min((stages - s - 1) * 2 + (virtual - 1) * stages, total)
    order = [forward(k) for k in range(warmup)]
    for i in range(total - warmup):
        order += [forward(warmup + i), backward(i)]
    order += [backward(k) for k in range(total - warmup, total)]
    return order


def _zero_bubble_h1(stages: int, micro: int) -> list[list[Action]]:
    """ZB-H1's rules played out with unit times (F = B = W = 1, free transfers), every stage at once: a stage
    with nothing running takes its oldest backward whose gradient is in; else its next forward, while fewer than
    S-s micro-batches wait for their B (1F1B's count) and fewer than S for their W (1F1B's peak, the first
    stage's); else its oldest deferred W. The order each stage ends up with is its schedule."""
    orders: list[list[Action]] = [[] for _ in range(stages)]
    done: set[Action] = set()
    running: list[Action | None] = [None] * stages
    forward, deferred = [0] * stages, [[] for _ in range(stages)]
    last = stages - 1
    while len(done) < 3 * stages * micro:
        for s in range(stages):  # pick, on every idle stage, from what finished before this unit
            if running[s] is not None:
                continue
            waiting_b = sum(1 for m in range(micro) if Action("F", s, m) in done and Action("B", s, m) not in done)
            waiting_w = sum(1 for m in range(micro) if Action("F", s, m) in done and Action("W", s, m) not in done)
            started = set(orders[s])
            ready_b = [
                m
                for m in range(micro)
                if Action("F", s, m) in done
                and Action("B", s, m) not in started
                and (s == last or Action("B", s + 1, m) in done)
            ]
            m = forward[s]
            ready_f = m < micro and (s == 0 or Action("F", s - 1, m) in done)
            if ready_b:
                action = Action("B", s, min(ready_b))
            elif ready_f and waiting_b < stages - s and waiting_w < stages:
                action, forward[s] = Action("F", s, m), m + 1
            elif deferred[s]:
                action = Action("W", s, deferred[s].pop(0))
            else:
                continue
            orders[s].append(action)
            running[s] = action
        for s, action in enumerate(running):  # one unit passes
            if action is not None:
                done.add(action)
                if action.kind == "B":
                    deferred[s].append(action.micro)
                running[s] = None
    return orders
