"""Memory of a lowered program: tensors freed after their last use, state updated in place.

Two passes over what `lower_rank_program` (or `model_bytes` for a single segment) produced, so that a daemon holds
little more than the tensors a step needs:

- `free_early(program)`: `lower_rank_program` frees the tensors passed between steps at the end of the program;
  this moves each free to right after the tensor's last reader, so a level3 weight gathered for one layer, a whole
  gradient reduce-scattered into its block or an activation no later step reads dies with its last use instead of
  living to the end of the step.
- `mark_inplace(onnx_bytes, state)`: the daemon double-buffers every state tensor a segment writes (it reads
  buffer A and writes the new value into B), which doubles the parameters and optimizer state. A state tensor whose
  every reader is an element-wise op that runs before (or is) the element-wise op computing its new value can be
  written over in place: the model then carries its name in the metadata entry "tessel.inplace", and the daemon
  binds the input and the new value to one buffer. Readers that are not element-wise (a MatMul of the forward pass
  in a fused train step) keep the double buffer, as do state tensors an asynchronous collective may still be
  reading when the update runs (`read_in_flight`).

    program = free_early(mark_program_inplace(lower_rank_program(graph, state=names, world_size=4)))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable

import onnx

from tessel.compiler.lower_onnx import assign_output_name
from tessel.compiler.rank_program import RankProgram
from tessel.v1 import daemon_pb2

INPLACE_KEY = "tessel.inplace"

# ONNX ops that compute element i of their output from element i of their inputs (plus broadcast scalars): written
# over one of its inputs, such an op reads each element before it writes it.
ELEMENTWISE = frozenset(
    {
        "Abs",
        "Add",
        "Cast",
        "Ceil",
        "Clip",
        "Cos",
        "Div",
        "Equal",
        "Erf",
        "Exp",
        "Floor",
        "Greater",
        "GreaterOrEqual",
        "Identity",
        "Less",
        "LessOrEqual",
        "Log",
        "Max",
        "Min",
        "Mod",
        "Mul",
        "Neg",
        "Not",
        "Pow",
        "Reciprocal",
        "Relu",
        "Round",
        "Sigmoid",
        "Sign",
        "Sin",
        "Sqrt",
        "Sub",
        "Tanh",
        "Where",
    }
)


def inplace_safe(model: onnx.ModelProto, state: Iterable[str]) -> list[str]:
    """The state inputs of `model` whose new value ("<name>/new") may be written over the old one."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in set(node.input):
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    safe = []
    for name in state:
        new = assign_output_name(name)
        writer = producer.get(new)
        if writer is None or name in outputs:
            continue
        while writer.op_type == "Identity" and writer.input[0] in producer and writer.input[0] != name:
            writer = producer[writer.input[0]]  # ONNX Runtime drops the Identity: its producer writes the buffer
        if writer.op_type not in ELEMENTWISE:
            continue
        aliases = _aliases(name, readers)  # ONNX Runtime may hand a view's readers the state's own buffer
        if aliases & outputs:
            continue
        users = [node for alias in aliases for node in readers.get(alias, []) if node.op_type not in VIEWS]
        if any(node.op_type not in ELEMENTWISE for node in users):
            continue
        before = _ancestors(writer, producer)
        if all(node is writer or id(node) in before for node in users):
            safe.append(name)
    return safe


# ONNX ops whose result ONNX Runtime may make a view of their input's buffer instead of a copy. Cast counts too:
# where a kernel lacks the cast-to type (float16 MatMul on CPU) ONNX Runtime casts back and removes the pair, and
# the reader then reads the state's own buffer (measured: a to_float(float16) layer's weight, updated in place,
# was read updated by the backward pass of the layers before it).
VIEWS = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast"})


def _aliases(name: str, readers: dict[str, list[onnx.NodeProto]]) -> set[str]:
    """`name` and every result of a chain of views (VIEWS) of it: reading one of them reads `name`'s buffer."""
    found, stack = {name}, [name]
    while stack:
        for node in readers.get(stack.pop(), []):
            if node.op_type in VIEWS and node.output[0] not in found:
                found.add(node.output[0])
                stack.append(node.output[0])
    return found


def _ancestors(node: onnx.NodeProto, producer: dict[str, onnx.NodeProto]) -> set[int]:
    seen: set[int] = set()
    stack = [node]
    while stack:
        for name in stack.pop().input:
            parent = producer.get(name)
            if parent is not None and id(parent) not in seen:
                seen.add(id(parent))
                stack.append(parent)
    return seen


def mark_inplace(onnx_bytes: bytes, state: Collection[str], forbidden: Collection[str] = ()) -> bytes:
    """`onnx_bytes` with the state tensors it may update in place named in its metadata (the bytes unchanged when
    there are none). `forbidden`: state a collective reads, kept double-buffered."""
    if not state:
        return onnx_bytes
    model = onnx.load_from_string(onnx_bytes)
    names = [n for n in inplace_safe(model, state) if n not in set(forbidden)]
    if not names:
        return onnx_bytes
    entry = model.metadata_props.add()
    entry.key, entry.value = INPLACE_KEY, ",".join(names)
    return model.SerializeToString()


def inplace_names(metadata: dict[str, str]) -> set[str]:
    """The in-place state names of a model's metadata map (what the daemon reads back)."""
    value = metadata.get(INPLACE_KEY, "")
    return set(value.split(",")) if value else set()


def mark_program_inplace(program: RankProgram) -> RankProgram:
    """Every segment of `program` with its in-place state marked (state no collective may be reading while a
    segment writes it, `read_in_flight`)."""
    forbidden = read_in_flight(program)
    segments = {}
    for name, segment in program.segments.items():
        marked = mark_inplace(segment.onnx, segment.state, forbidden)
        segments[name] = segment if marked is segment.onnx else dataclasses.replace(segment, onnx=marked)
    return dataclasses.replace(program, segments=segments)


def read_in_flight(program: RankProgram) -> set[str]:
    """State that a collective may still be reading when a segment writes its new value: the inputs of an
    asynchronous collective that a segment run between its start and its wait updates, or that is not waited for
    within the program. A synchronous collective is done before the next instruction, and one waited for before
    the update has read its input (a level3 weight block all-gathered for the forward and backward passes, then
    updated: in place, instead of a second buffer per block)."""
    instructions = list(program.program.instructions)
    waits = {ins.wait.handle: i for i, ins in enumerate(instructions) if ins.WhichOneof("op") == "wait"}
    forbidden: set[str] = set()
    for index, ins in enumerate(instructions):
        if ins.WhichOneof("op") != "collective" or not set(ins.collective.inputs) - forbidden:
            continue
        end = waits.get(ins.collective.handle) if ins.collective.handle else index + 1
        if end is None or end < index:
            forbidden.update(ins.collective.inputs)
            continue
        written: set[str] = set()
        for between in instructions[index + 1 : end]:
            if between.WhichOneof("op") == "run_segment":
                segment = program.segments.get(between.run_segment.segment)
                written.update(segment.state if segment is not None else ())
        forbidden.update(name for name in ins.collective.inputs if name in written)
    return forbidden


def _reads(ins: daemon_pb2.Instruction, program: RankProgram) -> list[str]:
    which = ins.WhichOneof("op")
    if which == "run_segment":
        segment = program.segments.get(ins.run_segment.segment)
        return [v.name for v in segment.graph.inputs] if segment is not None else list(ins.run_segment.inputs)
    if which == "collective":
        return list(ins.collective.inputs)
    if which == "copy":
        return [ins.copy.source]
    return []


def _writes(ins: daemon_pb2.Instruction) -> list[str]:
    which = ins.WhichOneof("op")
    if which == "run_segment":
        return list(ins.run_segment.outputs)
    if which == "collective" and not ins.collective.handle:
        return list(ins.collective.outputs)
    return []


def free_early(program: RankProgram) -> RankProgram:
    """`program` with each tensor of its final FreeOp freed right after its last reader (see the module
    docstring); tensors no instruction reads after they are made are freed right after the instruction making
    them. Outputs of asynchronous collectives appear at their wait, which precedes every reader."""
    instructions = list(program.program.instructions)
    if not instructions or instructions[-1].WhichOneof("op") != "free":
        return program
    temporary = list(instructions[-1].free.names)
    body = instructions[:-1]
    last: dict[str, int] = {}
    handles: dict[str, list[str]] = {}
    for index, ins in enumerate(body):
        which = ins.WhichOneof("op")
        if which == "collective" and ins.collective.handle:
            handles[ins.collective.handle] = list(ins.collective.outputs)
        made = handles.pop(ins.wait.handle, []) if which == "wait" else _writes(ins)
        for name in (*_reads(ins, program), *made):
            last[name] = index
    after: dict[int, list[str]] = {}
    left = []
    for name in temporary:
        if name in last:
            after.setdefault(last[name], []).append(name)
        else:
            left.append(name)
    out = []
    for index, ins in enumerate(body):
        out.append(ins)
        if index in after:
            out.append(daemon_pb2.Instruction(free=daemon_pb2.FreeOp(names=after[index])))
    if left:
        out.append(daemon_pb2.Instruction(free=daemon_pb2.FreeOp(names=left)))
    return dataclasses.replace(program, program=daemon_pb2.Program(instructions=out))
