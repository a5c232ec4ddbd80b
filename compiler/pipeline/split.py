"""The pipeline pass: one rank's graph of the whole network (over its stage's devices, with one GradientOf) ->
the graph this rank runs, in the order its schedule runs it.

    piped = pipeline_rank_graph(graph, tags, data, schedule, physical=1, ranks_per_stage=2, local_rank=0)
    program = lower_rank_program(piped.graph, ..., phases=piped.phases)   # keeps the order, one segment per action
    check(schedule, piped.transfers)                                        # what every stage sends, checked dry

What it builds (stages.py says which node is which):
- the forward of each of this stage's pieces (v, m), a value another physical stage computed arriving by a
  Receive (posted at the start of the step, in the order its sender sends), a value another stage reads leaving
  by a Send right after the action that made it;
- the backward of each piece on its own: the gradient of what the piece sent on (seeded by the gradient that came
  back) or of its share of the loss (seeded by the loss's own backward, which needs no forward value of any
  micro-batch), with respect to the values it received (sent back) and the prologue values it read. A schedule
  that splits the backward gets B = what the gradients sent back need, W = the rest (the weight gradients);
- each prologue value's gradient summed over the pieces in the order they run, then one backward through the
  prologue (a Mirror's all-reduce over the stage's data-parallel ranks happens there, once per step), a parameter
  shared by several stages summed over them (an AllReduce per parameter, in one order everywhere), and the nodes
  that read the gradients (the optimizer's update) for this stage's parameters only;
- results computed on another stage (the loss) received at the end of the step, so every rank returns them;
  gradients of parameters this stage does not hold come back as zeros.

Every node gets a phase (the index of its action in Schedule.rank_ops; 0 = before the first action, the last =
after it): the lowering keeps the order and starts a segment at every phase change, so a stage waits for a
transfer exactly where its action needs it. The order is checked: a node that needs what a later action makes (a
loss whose gradient needs every micro-batch's forward) is an error naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from tessel.compiler import registry as ops
from tessel.compiler.autodiff import vjp
from tessel.compiler.builder import GraphBuilder, SymbolicTensor, apply
from tessel.compiler.ir import Attrs, Graph, Node, Value
from tessel.compiler.pipeline import registry
from tessel.compiler.pipeline.schedule import Action, Link, Op, Schedule, Transfers
from tessel.compiler.pipeline.stages import Parts, Tag, split_parts
from tessel.compiler.rank_rewrite import Rewriter, fold_value_free
from tessel.core.errors import ConfigurationError, NotSupportedYetError


@dataclass
class PipelinedGraph:
    """This rank's graph in run order, the phase of each node (keyed by its first output), what the whole
    pipeline sends (for the schedule check) and this rank's ops."""

    graph: Graph
    phases: dict[Value, int]
    transfers: Transfers
    ops: list[Op]
    parameters: tuple[str, ...]  # the graph inputs this stage's computation reads (its parameters and state)
    absent_outputs: tuple[int, ...] = ()  # outputs another stage computes and this rank returns zeros for


@dataclass
class _Cut:
    """A value one piece makes and pieces of later virtual stages read: who makes it, who reads it."""

    value: Value
    source: int  # virtual stage
    micro: int
    targets: set[int] = field(default_factory=set)


def pipeline_rank_graph(
    graph: Graph,
    tags: Mapping[Value, Tag],
    data: Collection[str],
    schedule: Schedule,
    physical: int,
    ranks_per_stage: int = 1,
    local_rank: int = 0,
    parameters: Collection[str] | None = None,
    local_outputs: Collection[int] = (),
) -> PipelinedGraph:
    """The graph stage `physical` runs (see the module docstring). `graph` is a rank graph of the whole network
    over one stage's `ranks_per_stage` devices (its collectives' groups count from 0), `local_rank` this rank's
    place among them; the result's groups are world ranks (stage s holds ranks s*R .. s*R+R-1). `data` names the
    graph inputs that are dataset columns; `parameters` the parameters (every stage must hold some);
    `local_outputs` the indices of outputs that stay on the stage computing them (what ops.Print prints) instead
    of being sent to every stage."""
    graph = _world_groups(fold_value_free(graph), physical * ranks_per_stage)
    parts = split_parts(graph, tags, data, schedule.virtual_stages)
    builder = _Builder(graph, parts, schedule, physical, ranks_per_stage, local_rank, set(local_outputs))
    if parameters is not None:
        builder.check_parameters(set(parameters))
    return builder.build()


def _world_groups(graph: Graph, offset: int) -> Graph:
    """`graph` with every `group` attribute moved from the stage's device indices to world ranks."""
    if offset == 0:
        return graph
    rewriter = Rewriter(graph)
    for node in graph.nodes:
        group = node.attrs.get("group")
        if isinstance(group, tuple):
            attrs = Attrs({**dict(node.attrs), "group": tuple(r + offset for r in group)})
            rewriter.keep(dataclasses.replace(node, attrs=attrs))
        else:
            rewriter.keep(node)
    return rewriter.build()


def _tensor(builder: GraphBuilder, value: Value) -> SymbolicTensor:
    return SymbolicTensor(builder, value)


class _Builder:
    def __init__(
        self, graph: Graph, parts: Parts, schedule: Schedule, physical: int, ranks: int, local: int, kept=frozenset()
    ):
        self.graph, self.parts, self.schedule, self.physical = graph, parts, schedule, physical
        self.local_outputs = {graph.outputs[i] for i in kept}
        self.absent: list[int] = []
        self.ranks, self.local = ranks, local
        self.chunks = set(schedule.chunks(physical))
        self.b = GraphBuilder(f"{graph.name}_stage{physical}")
        self.b.inputs = list(graph.inputs)
        self.env: dict[Value, Value] = {v: v for v in graph.inputs}
        self.phase: dict[Node, float] = {}  # fractions order a phase's sums and sends after its action's nodes
        self.producer = graph.producers
        self.made_by: dict[Value, Node] = {}
        self.position = {n: i for i, n in enumerate(graph.nodes)}
        self.cuts = self._cuts()
        self.links = self._links()

    def world(self, physical: int) -> int:
        return physical * self.ranks + self.local

    # --- what crosses between stages ----------------------------------------------------------------------------
    def _cuts(self) -> dict[Value, _Cut]:
        """Values read on a later virtual stage than the one that makes them, in graph order."""
        parts, cuts = self.parts, {}
        for node in (*[n for nodes in parts.pieces.values() for n in nodes], *parts.epilogue):
            for v in node.inputs:
                maker = self.producer.get(v)
                if maker is None or maker not in parts.stage or parts.stage[maker] == parts.stage[node]:
                    continue
                if maker not in parts.micro:
                    raise NotSupportedYetError(
                        f"not supported yet: {parts.where(maker)} combines micro-batches on stage "
                        f"{parts.stage[maker]} for the later stage {parts.stage[node]}, pipeline stages exchange "
                        "one micro-batch's tensors at a time; combine the micro-batches' results (the loss) on the "
                        "last stage"
                    )
                if node in parts.epilogue and not self._same_rank(parts.stage[maker], parts.stage[node]):
                    raise NotSupportedYetError(
                        f"not supported yet: {parts.where(node)} combines the micro-batches' results on stage "
                        f"{parts.stage[node]} from stage {parts.stage[maker]}, which another rank runs; compute the "
                        "loss on the network's last stage"
                    )
                cut = cuts.setdefault(v, _Cut(v, parts.stage[maker], parts.micro[maker]))
                cut.targets.add(parts.stage[node])
        return dict(sorted(cuts.items(), key=lambda kv: self.position[self.producer[kv[0]]]))

    def _same_rank(self, a: int, b: int) -> bool:
        return self.schedule.placement(a) == self.schedule.placement(b)

    def _links(self) -> dict[tuple[int, int, int], tuple[list[Value], list[Value]]]:
        """(source, target, micro) -> the values crossing from virtual stage source to target, and the ones whose
        gradient comes back (float values, when the step differentiates)."""
        links: dict[tuple[int, int, int], tuple[list[Value], list[Value]]] = {}
        for cut in self.cuts.values():
            for target in sorted(cut.targets):
                forward, backward = links.setdefault((cut.source, target, cut.micro), ([], []))
                forward.append(cut.value)
                if cut.value.dtype.is_float and self.parts.gradient is not None:
                    backward.append(cut.value)
        by_pair: dict[tuple[int, int], set[tuple[int, int]]] = {}
        for (source, target, _), (forward, backward) in links.items():
            by_pair.setdefault((source, target), set()).add((len(forward), len(backward)))
        for (source, target), counts in by_pair.items():
            if len(counts) > 1:
                raise ConfigurationError(
                    f"the micro-batches send different numbers of tensors from pipeline stage {source} to stage "
                    f"{target} ({sorted(counts)}); the rule: every micro-batch runs the same network"
                )
        return links

    def transfers(self) -> Transfers:
        pairs = {(s, t): (len(f), len(b)) for (s, t, _), (f, b) in self.links.items()}
        links = tuple(Link(s, t, f, b) for (s, t), (f, b) in sorted(pairs.items()))
        return Transfers(links, tuple(sorted(self.results_from.items())), tuple(self.syncs))

    def _message_value(self, message) -> Value:
        """The tensor (of the original graph) a message carries."""
        if message.kind == "out":
            return [v for v, owner in self.result_owner.items() if owner == message.source][message.index]
        forward, backward = self.links[(message.source, message.target, message.micro)]
        return (forward if message.kind == "act" else backward)[message.index]

    # --- the build ------------------------------------------------------------------------------------------------
    def build(self) -> PipelinedGraph:
        self._check_pieces()
        self._plan_results_and_syncs()
        transfers = self.transfers()
        self.ops = self.schedule.rank_ops(self.physical, transfers)
        self.action_phase = {op.action: k + 1 for k, op in enumerate(self.ops) if op.kind == "compute"}
        self.end = len(self.ops) + 1
        self.post_stages = self._post_stages()
        self._receives()
        self._prologue()
        self._forward()
        grads = self._backward() if self.parts.gradient is not None else {}
        self._post(grads)
        outputs = self._outputs()
        self._sends()
        order = sorted(self.b.nodes, key=lambda n: self.phase[n])  # stable: emission order within a phase
        _check_order(order, self)
        read = {v for n in order for v in n.inputs}
        inputs = tuple(v for v in self.b.inputs if v in read or v in outputs)
        out_graph = Graph(inputs, tuple(order), tuple(outputs), self.b.name)
        phases = {n.outputs[0]: int(self.phase[n]) for n in order if n.outputs}
        actions = {k + 1: repr(op.action) for k, op in enumerate(self.ops) if op.kind == "compute"}
        registry.record(phases, order, actions)
        names = tuple(v.name for v in inputs)
        return PipelinedGraph(out_graph, phases, transfers, self.ops, names, tuple(self.absent))

    def _check_pieces(self) -> None:
        have = {v for v, _ in self.parts.pieces}
        missing = sorted(set(range(self.schedule.virtual_stages)) - have)
        if missing:
            raise ConfigurationError(
                f"pipeline stage(s) {missing} of {self.schedule.virtual_stages} compute nothing; the rule: every "
                "stage runs part of the network (pipeline_stage numbers 0 .. stages-1, each on some cell). Fix: "
                "set pipeline_stage on the cells so that every stage gets one"
            )

    def check_parameters(self, parameters: set[str]) -> None:
        """Every physical stage holds parameters (MindSpore's rule: pipeline_stage goes on cells with parameters)."""
        for stage in range(self.schedule.stages):
            held = [v.name for v in self.graph.inputs if v.name in parameters and stage in self._holders(v)]
            if held:
                continue
            staged = self.parts.stage
            cells = sorted(
                {c for n, c in self.parts.cells.items() if n in staged and self.schedule.placement(staged[n]) == stage}
            )
            on = f"its cells {cells} have none" if cells else "no cell is on it"
            raise ConfigurationError(
                f"pipeline stage {stage} holds no parameters ({on}); the rule: every stage holds parameters, so set "
                "pipeline_stage on cells that have parameters (Dense, Conv2d, ...). Fix: move a cell with parameters "
                f"to stage {stage}, or use fewer pipeline_stages"
            )

    def _plan_results_and_syncs(self) -> None:
        parts, schedule = self.parts, self.schedule
        self.results_from: dict[int, int] = {}
        self.result_owner: dict[Value, int] = {}
        for v in dict.fromkeys(self.graph.outputs):
            maker = self.producer.get(v)
            if maker is not None and maker in parts.stage and v not in self.local_outputs:
                owner = schedule.placement(parts.stage[maker])
                self.result_owner[v] = owner
                self.results_from[owner] = self.results_from.get(owner, 0) + 1
        self.syncs: list[tuple[int, ...]] = []
        self.sync_of: dict[Value, tuple[int, ...]] = {}
        if parts.gradient is not None:
            for w in self._wrt():
                holders = self._holders(w)
                if len(holders) > 1:
                    self.syncs.append(holders)
                    self.sync_of[w] = holders

    def _holders(self, value: Value) -> tuple[int, ...]:
        """The physical stages reading a prologue value or graph input."""
        return tuple(sorted({self.schedule.placement(v) for v in self.parts.uses.get(value, ())}))

    def _wrt(self) -> list[Value]:
        node = self.parts.gradient
        return list(node.inputs[1 : len(node.inputs) - node.attrs["seeded"]])

    def _post_stages(self) -> dict[Value, tuple[int, ...]]:
        """The physical stages each post value belongs to: those of the parameters (and gradients) it reads; none
        for global optimizer state (every stage keeps its copy)."""
        parts = self.parts
        stages: dict[Value, tuple[int, ...]] = {}
        if parts.gradient is not None:
            for out, w in zip(parts.gradient.outputs, self._wrt()):
                stages[out] = self._holders(w)
        for node in parts.post:
            mine: set[int] = set()
            for v in node.inputs:
                mine.update(stages[v] if v in stages else self._holders(v))
            stages.update((o, tuple(sorted(mine))) for o in node.outputs)
        return stages

    def _mine(self, node: Node) -> bool:
        """A post node runs here: it touches this stage's parameters, or no stage's."""
        stages = self.post_stages[node.outputs[0]] if node.outputs else ()
        return not stages or self.physical in stages

    def emit(self, phase: float | None, fn, *args, **kwargs):
        """Emit nodes with `fn`; each gets `phase`, or (None) the latest phase of what it reads."""
        start = len(self.b.nodes)
        result = fn(*args, **kwargs)
        for node in self.b.nodes[start:]:
            self._place(node, max((self._phase_of(v) for v in node.inputs), default=0) if phase is None else phase)
        return result

    def _place(self, node: Node, phase: float) -> None:
        self.phase[node] = phase
        for o in node.outputs:
            self.made_by[o] = node

    def _phase_of(self, value: Value) -> float:
        maker = self.made_by.get(value)
        return self.phase[maker] if maker is not None else 0

    def keep(self, node: Node, phase: float) -> None:
        inputs = tuple(self.env.get(v, v) for v in node.inputs)
        same = all(a is b for a, b in zip(inputs, node.inputs))
        kept = node if same else dataclasses.replace(node, inputs=inputs)
        self.b.nodes.append(kept)
        self._place(kept, phase)
        self.env.update((o, o) for o in node.outputs)

    # --- receives, prologue, forward ------------------------------------------------------------------------------
    def _receives(self) -> None:
        """Every receive, posted before the first action in the order the senders send (Schedule.rank_ops)."""
        self.received: dict[tuple, Value] = {}
        self.after = self.emit(0, self.b.constant, 0.0)  # orders nothing: a Receive needs one input
        for op in self.ops:
            if op.kind != "recv":
                continue
            m = op.message
            value = self._message_value(m)
            group = (self.world(op.peer), self.world(self.physical))
            got = self.emit(
                0,
                apply,
                "Receive",
                _tensor(self.b, self.after),
                peer=0,
                shape=tuple(value.shape),
                dtype=value.dtype,
                group=group,
            )
            self.received[(m.kind, m.source, m.target, m.micro, m.index)] = got.value

    def _prologue(self) -> None:
        """Prologue nodes this stage reads (directly, through others or in its update), once at the start."""
        parts = self.parts
        wanted: set[Value] = set(self.graph.outputs)
        for (v, _), nodes in parts.pieces.items():
            if v in self.chunks:
                wanted.update(x for n in nodes for x in n.inputs)
        wanted.update(x for n in self._epilogue() for x in n.inputs)
        if parts.gradient is not None and self._holds_loss():
            wanted.update(parts.gradient.inputs)
        wanted.update(x for n in parts.post if self._mine(n) for x in n.inputs)
        needed: set[Node] = set()
        for node in reversed(parts.prologue):
            if ops.get(node.op).side_effect or any(o in wanted for o in node.outputs):
                needed.add(node)
                wanted.update(node.inputs)
        for node in parts.prologue:
            if node in needed:
                self.keep(node, 0)

    def _epilogue(self) -> list[Node]:
        return [n for n in self.parts.epilogue if self.parts.stage[n] in self.chunks]

    def _holds_loss(self) -> bool:
        maker = self.producer.get(self.parts.gradient.inputs[0])
        return maker is not None and self.parts.stage.get(maker) in self.chunks

    def _forward(self) -> None:
        """Each local piece's nodes in its F action (received values read through their Receive), and each
        epilogue node once the pieces it reads have run."""
        parts = self.parts
        for (v, m), nodes in sorted(parts.pieces.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            if v not in self.chunks:
                continue
            self._bind_received(v, m)
            for node in nodes:
                self.keep(node, self.action_phase[Action("F", v, m)])
        for node in self._epilogue():
            self.keep(node, max((self._phase_of(self.env.get(x, x)) for x in node.inputs), default=0))

    def _bind_received(self, target: int, micro: int) -> None:
        """The values F(target, micro) receives from other ranks read their Receive from now on."""
        for (source, to, m), (forward, _) in self.links.items():
            if to == target and m == micro and not self._same_rank(source, target):
                for index, value in enumerate(forward):
                    self.env[value] = self.received[("act", source, target, micro, index)]

    def _sends(self) -> None:
        """Every send, in this stage's order (Schedule.rank_ops), right after the action that made it."""
        owned = [u for u, o in self.result_owner.items() if o == self.physical]
        for op in self.ops:
            if op.kind != "send":
                continue
            m = op.message
            if m.kind == "act":
                value, phase = self.env[self._message_value(m)], self.action_phase[Action("F", m.source, m.micro)]
            elif m.kind == "grad":
                value, phase = (
                    self.grad_out[(m.source, m.target, m.micro, m.index)],
                    self.action_phase[Action("B", m.target, m.micro)],
                )
            else:
                value, phase = self.env[owned[m.index]], self.end + 0.9
            group = (self.world(self.physical), self.world(op.peer))
            after = phase if m.kind == "out" else phase + 0.5
            self.emit(after, apply, "Send", _tensor(self.b, value), peer=1, group=group)

    # --- backward ----------------------------------------------------------------------------------------------
    def _backward(self) -> dict[Value, Value]:
        """The gradient of every local wrt value (see the module docstring); returns GradientOf output -> it."""
        parts, node = self.parts, self.parts.gradient
        active = self._active(self._wrt())
        loss, seeded = node.inputs[0], node.attrs["seeded"]
        seeds: dict[Value, Value] = {}
        if self._holds_loss():
            seed = self.env.get(node.inputs[-1]) if seeded else None
            if seed is None:
                (seed,) = self.emit(0, self.b.emit, "Ones", (), {"shape": tuple(loss.shape), "dtype": loss.dtype})
            seeds = self._seeds(self.env.get(loss, loss), seed)
        self.grad_out: dict[tuple[int, int, int, int], Value] = {}
        sums: dict[Value, list[tuple[Action, Value]]] = {}
        local_grads: dict[tuple[Value, int], Value] = {}
        for v, m in sorted((k for k in parts.pieces if k[0] in self.chunks), key=lambda k: (k[1], -k[0])):
            self._piece_backward(v, m, active, seeds, sums, local_grads)
        return self._through_prologue(self._accumulate(sums))

    def _active(self, wrt: list[Value]) -> set[Value]:
        """Values that depend on a wrt value through prologue nodes (what pieces read that needs a gradient)."""
        active = set(wrt)
        for node in self.parts.prologue:
            if any(v in active for v in node.inputs) and ops.get(node.op).grad is not ops.ZERO_GRAD:
                active.update(o for o in node.outputs if o.dtype.is_float)
        return active

    def _seeds(self, loss: Value, seed: Value) -> dict[Value, Value]:
        """The loss's own backward, down to the piece values the epilogue combines (each micro-batch's loss); it
        runs as soon as what it reads exists (for a sum of losses: at the start)."""
        combined = [x for n in self._epilogue() for x in n.inputs if self.producer.get(x) in self.parts.micro]
        combined = list(dict.fromkeys(x for x in combined if x.dtype.is_float))
        if self.producer.get(self.parts.gradient.inputs[0]) in self.parts.micro:  # the loss is a piece's own value
            return {self.parts.gradient.inputs[0]: seed}
        if not combined:
            return {}
        grads = self.emit(None, vjp, self.b, [(loss, seed)], [self.env.get(x, x) for x in combined])
        return dict(zip(combined, grads))

    def _piece_backward(self, v: int, m: int, active, seeds, sums, local_grads) -> None:
        """One piece's backward: roots are its values the loss or a later stage used, each seeded by its
        gradient; it differentiates with respect to what it received and the prologue values it read."""
        nodes = self.parts.pieces[(v, m)]
        # The values this piece received read its own Receive: a value sent to two virtual stages of this rank
        # (a skip link under interleaving) has one Receive each, and env holds the one bound last.
        self._bind_received(v, m)
        made = {o for n in nodes for o in n.outputs}
        roots: list[tuple[Value, Value]] = [(x, g) for x, g in seeds.items() if x in made]
        for (source, target, micro), (_, backward) in self.links.items():
            if source != v or micro != m:
                continue
            for index, x in enumerate(backward):
                if self._same_rank(source, target):
                    if (x, target) in local_grads:
                        roots.append((x, local_grads[(x, target)]))
                else:
                    roots.append((x, self.received[("grad", source, target, m, index)]))
        if not roots:
            return
        reads = list(dict.fromkeys(x for n in nodes for x in n.inputs if x not in made))
        received = [x for x in reads if x in self.cuts and x.dtype.is_float]
        weights = [x for x in reads if x in active and x not in self.cuts]
        start = len(self.b.nodes)
        wrt = [self.env.get(x, x) for x in received + weights]
        grads = vjp(self.b, [(self.env.get(x, x), g) for x, g in roots], wrt)
        emitted = self.b.nodes[start:]
        b_phase = self.action_phase[Action("B", v, m)]
        w_phase = self.action_phase.get(Action("W", v, m), b_phase)
        b_nodes = _ancestors(emitted, set(grads[: len(received)])) if self.schedule.split_backward else set(emitted)
        for node in emitted:
            self._place(node, b_phase if node in b_nodes else w_phase)
        for x, g in zip(received, grads):
            cut = self.cuts[x]
            if self._same_rank(cut.source, v):
                local_grads[(x, v)] = g
            else:
                _, backward = self.links[(cut.source, v, m)]
                self.grad_out[(cut.source, v, m, backward.index(x))] = g
        kind = "W" if self.schedule.split_backward else "B"
        for x, g in zip(weights, grads[len(received) :]):
            sums.setdefault(x, []).append((Action(kind, v, m), g))

    def _accumulate(self, sums: dict[Value, list[tuple[Action, Value]]]) -> dict[Value, Value]:
        """Each read value's gradient summed over the pieces, in the order their actions run."""
        out = {}
        for x, terms in sums.items():
            terms = sorted(terms, key=lambda t: self.action_phase[t[0]])
            total = terms[0][1]
            for action, g in terms[1:]:
                phase = self.action_phase[action] + 0.25
                total = self.emit(phase, apply, "Add", _tensor(self.b, total), _tensor(self.b, g)).value
            out[x] = total
        return out

    def _through_prologue(self, accumulated: dict[Value, Value]) -> dict[Value, Value]:
        """The prologue's backward from the summed gradients (a Mirror's all-reduce: once per step), then the sum
        over the stages sharing a parameter; returns GradientOf output -> gradient, for this stage's wrt."""
        wrt = self._wrt()
        mine = [w for w in wrt if self.physical in self._holders(w)]
        unused = [w for w in wrt if not self._holders(w)]  # no stage reads it: a zero gradient everywhere
        grads: dict[Value, Value] = {}
        if mine and accumulated:
            roots = [(self.env.get(x, x), g) for x, g in accumulated.items()]
            values = self.emit(self.end, vjp, self.b, roots, [self.env.get(w, w) for w in mine])
            grads = dict(zip(mine, values))
        for w in [*unused, *(w for w in mine if w not in grads)]:  # nothing this stage ran reads it
            grads[w] = self.emit(self.end, apply, "ZerosLike", _tensor(self.b, self.env.get(w, w))).value
        for w in mine:
            if w in self.sync_of:
                group = tuple(self.world(s) for s in self.sync_of[w])
                summed = _tensor(self.b, grads[w])
                grads[w] = self.emit(self.end + 0.25, apply, "AllReduce", summed, reduce_op="sum", group=group).value
        return {out: grads[w] for out, w in zip(self.parts.gradient.outputs, wrt) if w in grads}

    # --- after the gradients ------------------------------------------------------------------------------------
    def _post(self, grads: dict[Value, Value]) -> None:
        """The nodes reading the gradients that touch this stage's parameters (or none: global optimizer state)."""
        self.env.update(grads)
        for node in self.parts.post:
            if not self._mine(node):
                continue
            missing = [v for v in node.inputs if v not in self.env]
            if missing:
                raise NotSupportedYetError(
                    f"not supported yet: {self.parts.where(node)} combines what several pipeline stages hold (the "
                    f"gradients of parameters on stages {list(self.post_stages[node.outputs[0]])}), a stage only "
                    "holds its own parameters' gradients; apply such a function per parameter (clipping gradients "
                    "by their global norm is not available with pipeline parallel yet)"
                )
            self.keep(node, self.end + 0.5)

    def _outputs(self) -> list[Value]:
        outputs = []
        for index, v in enumerate(self.graph.outputs):
            owner = self.result_owner.get(v)
            if owner is not None and owner != self.physical:
                index = [u for u, o in self.result_owner.items() if o == owner].index(v)
                outputs.append(self.received[("out", owner, self.physical, 0, index)])
            elif v in self.env:
                outputs.append(self.env[v])
            else:  # a gradient (or what the update computes) of a parameter another stage holds
                self.absent.append(index)
                attrs = {"shape": tuple(v.shape), "dtype": v.dtype}
                outputs += self.emit(self.end + 0.75, self.b.emit, "Zeros", (), attrs)
        return outputs


def _ancestors(nodes: list[Node], targets: set[Value]) -> set[Node]:
    """The nodes among `nodes` that compute (directly or not) one of `targets`."""
    needed, out = set(targets), set()
    for node in reversed(nodes):
        if any(o in needed for o in node.outputs):
            out.add(node)
            needed.update(node.inputs)
    return out


def _check_order(order: list[Node], builder: _Builder) -> None:
    """Every node reads only graph inputs and what nodes before it made."""
    have = set(builder.b.inputs)
    makers = {o: n for n in order for o in n.outputs}
    for node in order:
        for v in node.inputs:
            if v not in have:
                maker = makers[v]
                raise ConfigurationError(
                    f"pipeline stage {builder.physical}: {node.op} (in {_action_of(builder, node)}) needs what "
                    f"{maker.op} (in {_action_of(builder, maker)}) computes later in the schedule "
                    f"{builder.schedule.name!r}; the rule: a micro-batch's backward needs nothing from a later "
                    "micro-batch. Fix: make the loss a sum (or a scaled sum) of the micro-batches' losses, as "
                    "PipelineCell returns it, or use pipeline_scheduler 'gpipe'"
                )
        have.update(node.outputs)


def _action_of(builder: _Builder, node: Node) -> str:
    phase = int(builder.phase.get(node, 0))
    if phase == 0:
        return "the start of the step"
    if phase >= builder.end:
        return "the update after the last action"
    return f"action {builder.ops[phase - 1]!r}"
