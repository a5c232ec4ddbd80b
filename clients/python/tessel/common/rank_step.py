"""The parallel side of training: which gradient reduction a train step gets, replica checks, and sink mode.

* `parallel_train_program` turns a traced loss graph into the train step of the current parallel mode:
  DATA_PARALLEL mirrors every parameter over the world (bucketed, overlapped gradient AllReduce, mean with
  gradients_mean); SEMI_AUTO/AUTO_PARALLEL partitions the graph for this rank (`tessel.parallel.semi_auto`) first;
  STAND_ALONE / HYBRID_PARALLEL keep the user's own collectives (manual parallelism) and add none.
* `check_replicas`: every rank must start data parallelism from identical parameters (same seed, same init); a
  checksum per parameter is all-gathered once and a difference is an error naming the parameter and the ranks.
* `run_sunk`: sink mode. The dataset's spec goes to the daemon, which reads its own shard; one Execute runs
  `[NextBatch, <train step>]` k times and returns the k losses.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from tessel import context, profiler
from tessel.common.support import log_once
from tessel.compiler import DEFAULT_BUCKET_BYTES, TrainProgram, bucket_allreduce, build_train_step, mirror_parameters
from tessel.compiler.buckets import set_fusion, sync_in_fp32, weigh_gradients
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.v1 import daemon_pb2

_PARALLEL = context.ParallelMode
_MEAN_MODES = (_PARALLEL.DATA_PARALLEL, _PARALLEL.SEMI_AUTO_PARALLEL, _PARALLEL.AUTO_PARALLEL)
_datasets = itertools.count()
# This rank's gradient weight while Model.train runs an uneven split of the global batch (batch_split): n * share /
# B, so the mean over the ranks equals one device's gradient (compiler.buckets.data_parallel_train_step). None: no
# split runs (outside Model.train, whose epochs alone batch_split applies to).
_gradient_weight: float | None = None


def gradient_weight() -> float:
    return 1.0 if _gradient_weight is None else _gradient_weight


def set_gradient_weight(weight: float | None) -> None:
    """Model.train sets it for each epoch of a split (1.0: equal shares) and None after; part of the step's key."""
    global _gradient_weight
    _gradient_weight = None if weight is None else float(weight)


def check_split_runs() -> None:
    """batch_split applies to Model.train's epochs alone: a data-parallel train step run outside them (a loop of
    the user's own) with batch_split set would run the even split. Checked as each step is called, not only as it
    is traced: a step traced in Model.train may be called again by such a loop."""
    if _gradient_weight is not None or parallel_mode() != _PARALLEL.DATA_PARALLEL or world_size() == 1:
        return
    setting = context.get_auto_parallel_context("batch_split")
    if setting != "even":
        raise NotSupportedYetError(
            f"not supported yet: batch_split={setting!r} in a training loop of your own; Model.train splits the "
            "batch (it asks the coordinator for each epoch's shares and reads them from the dataset), a loop of "
            "your own would run the even split: use Model.train, or set batch_split='even'"
        )


def world_size() -> int:
    from tessel.common.engine import engine

    return engine().world_size


def parallel_mode() -> str:
    return context.get_auto_parallel_context("parallel_mode")


def data_parallel() -> bool:
    """DATA_PARALLEL over more than one rank: train steps reduce gradients themselves."""
    return parallel_mode() == _PARALLEL.DATA_PARALLEL and world_size() > 1


def bucket_bytes() -> int:
    """Gradient bucket size: set_auto_parallel_context(comm_fusion={"allreduce": {"mode": "size", "config": MB}})
    (MindSpore's knob), else 25 MiB (DDP's default)."""
    fusion = context.get_auto_parallel_context("comm_fusion") or {}
    config = fusion.get("allreduce", {}) if isinstance(fusion, dict) else {}
    if config.get("mode") == "size":
        size = config.get("config")
        if isinstance(size, bool) or not isinstance(size, (int, float)) or size <= 0:
            raise ConfigurationError(f"comm_fusion allreduce config must be a positive size in MB, got {size!r}")
        return int(size * 2**20)
    return DEFAULT_BUCKET_BYTES


def check_mode() -> None:
    """gradients_mean only means something where the framework reduces gradients itself."""
    mode = parallel_mode()
    if context.get_auto_parallel_context("gradients_mean") and mode not in _MEAN_MODES and world_size() > 1:
        raise ConfigurationError(
            f"gradients_mean=True is not supported with parallel_mode={mode!r}: only {list(_MEAN_MODES)} reduce "
            "gradients themselves. Set parallel_mode=ParallelMode.DATA_PARALLEL, or drop gradients_mean and "
            "average in the network (manual parallelism: ops.AllReduce()(loss) / get_group_size())"
        )


def shard_config():
    """The optimizer-parallel settings of the context (enable_parallel_optimizer, parallel_optimizer_config,
    AutoParallel.hsdp) as a compiler ShardConfig, or None when optimizer parallel is off."""
    settings = context.optimizer_shard_config()
    if settings is None:
        return None
    from tessel.compiler.optimizer_parallel import ShardConfig

    level, threshold, size = settings
    return ShardConfig(level, threshold, size)


def parallel_train_program(
    graph, trace, keys: Sequence[str], rule, groups, fixed: Callable[[], dict], exclude=(), fusion=None, local=()
):
    """(TrainProgram, RankPartition or None, {key: ParamShard}) for the current parallel mode (see the module
    docstring); `groups` is what the optimizer's parameter groups set per parameter (compiler ParameterGroups);
    `fixed()` gives the layouts of parameters an earlier plan of this job sliced; `exclude` names the
    parameters optimizer parallel must leave whole (Parameter(parallel_optimizer=False)). With optimizer parallel
    on, the shards say which parameters this rank reduce-scatters and updates a block of (compiler/
    optimizer_parallel.py). `fusion` maps a parameter key to its comm_fusion index: only gradients of one index
    share a bucket, index 0 is reduced alone. `local` names the parameters whose gradients data parallelism leaves
    unreduced (Parameter(layerwise_parallel=True), as MindSpore: each rank updates its own copy)."""
    mode, world = parallel_mode(), world_size()
    config = shard_config()
    if world > 1:
        from tessel.parallel import pipeline

        pipeline.current_mesh()  # pipeline_stages > 1 outside SEMI_AUTO / AUTO (or not dividing the world): an error
    if world > 1 and mode == _PARALLEL.DATA_PARALLEL:
        mean = bool(context.get_auto_parallel_context("gradients_mean"))
        if gradient_weight() != 1.0:  # an uneven batch split (batch_split): see gradient_weight
            graph = weigh_gradients(graph, _gradient_weight)
        local = frozenset(local)
        mirrored = [k for k in keys if k not in local]
        forward = set_fusion(mirror_parameters(graph, mirrored, tuple(range(world)), mean=mean), fusion or {})
        program, shards = _sharded_step(forward, keys, rule, groups, config, frozenset(exclude) | local)
        return _with_graph(program, bucket_allreduce(program.graph, bucket_bytes())), None, shards
    if world > 1 and mode in (_PARALLEL.SEMI_AUTO_PARALLEL, _PARALLEL.AUTO_PARALLEL):
        try:
            from tessel.parallel.semi_auto import partition_for_rank
        except ImportError as missing:
            raise ConfigurationError(
                f"parallel_mode={mode!r}: semi-auto parallelism is not available in this build ({missing}); "
                "use DATA_PARALLEL or manual parallelism (HYBRID_PARALLEL)"
            ) from None
        from tessel.communication import get_rank
        from tessel.parallel import pipeline

        where = pipeline.mesh(world, get_rank())  # under pipeline parallel: plan for the ranks of one stage
        # Outside pipeline stages a full_batch input the plan only reads in slices is sent as this rank's slice.
        slicing = dataset_whole() and not where.pipelined
        part = partition_for_rank(
            graph, trace, list(keys), None, where.index, where.devices, fixed(), slice_whole_inputs=slicing
        )
        if where.pipelined:
            if config is not None:
                from tessel.common.support import not_supported_yet

                raise not_supported_yet(
                    f"enable_parallel_optimizer=True with pipeline_stages={where.stages}",
                    "pipeline stages do not shard their optimizer state yet (each rank holds only its stage's "
                    "parameters and state already). Fix: set_auto_parallel_context(enable_parallel_optimizer=False) "
                    "under pipeline parallel",
                )
            program = build_train_step(part.graph, keys, rule, groups, deferred_gradients=True)
            piped = pipeline.train_stage(program.graph, graph, part, trace, keys, where)
            held = set(piped.parameters)
            program = dataclasses.replace(program, state=tuple(s for s in program.state if s.name in held))
            return _with_graph(program, bucket_allreduce(piped.graph, bucket_bytes())), part, {}
        forward = sync_in_fp32(part.graph) if context.get_auto_parallel_context("gradient_fp32_sync") else part.graph
        forward = set_fusion(forward, fusion or {})
        program, shards = _sharded_step(forward, keys, rule, groups, config, frozenset(exclude))
        return _with_graph(program, bucket_allreduce(program.graph, bucket_bytes())), part, shards
    if config is not None and world > 1:
        log_once(
            "optimizer-parallel-mode",
            f"enable_parallel_optimizer: parallel_mode={mode!r} reduces no gradients itself, so there is no "
            "replicated parameter to shard; optimizer parallel applies under DATA_PARALLEL, SEMI_AUTO_PARALLEL "
            "and AUTO_PARALLEL",
        )
    return build_train_step(graph, keys, rule, groups), None, {}


def _sharded_step(forward, keys, rule, groups, config, exclude) -> tuple[TrainProgram, dict]:
    """build_train_step with this rank's optimizer-parallel shards (none when `config` is None)."""
    shards = {}
    if config is not None:
        from tessel.communication import get_rank
        from tessel.compiler.optimizer_parallel import plan_shards, shard_forward

        shards = plan_shards(forward, keys, config, get_rank(), exclude)
        forward = shard_forward(forward, shards)
    return build_train_step(forward, keys, rule, groups, shards=shards), shards


def global_inputs(inputs: Sequence[Any]) -> tuple | None:
    """Stand-ins of the global (traced) shape for a semi-auto train step's data inputs when each rank's dataset
    yields only its slice (full_batch=False or a dataset_strategy); None when the inputs are traced as they are
    (not semi-auto, one rank, or full_batch=True). The stand-ins are zero-stride views: no global batch is
    allocated, only its shape and dtype matter to the trace."""
    mode, world = parallel_mode(), world_size()
    if world == 1 or mode not in (_PARALLEL.SEMI_AUTO_PARALLEL, _PARALLEL.AUTO_PARALLEL):
        return None
    from tessel.parallel import pipeline
    from tessel.parallel.semi_auto import dataset_setting, global_shape

    world = pipeline.current_mesh().devices  # the ranks of one pipeline stage share the batch

    dataset = dataset_setting()
    if dataset == "full_batch":
        return None
    out, column = [], 0
    for value in inputs:
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            out.append(value)
            continue
        dtype = value.dtype if isinstance(value, np.ndarray) else value.dtype.numpy
        shape = global_shape(tuple(value.shape), column, world, dataset)
        out.append(np.broadcast_to(np.zeros((), dtype), shape))
        column += 1
    return tuple(out)


def _with_graph(program: TrainProgram, graph) -> TrainProgram:
    import dataclasses

    return dataclasses.replace(program, graph=graph)


# --- identical replicas ---------------------------------------------------------------------------------------


_broadcast: set[tuple[int, str]] = set()  # (engine id, parameter key) already taken from rank 0


def broadcast_parameters(params: Sequence[Any]) -> None:
    """parameter_broadcast=True: before a compiled graph first runs, every rank takes rank 0's value of each
    parameter it reads (once per parameter and job), as MindSpore broadcasts parameters when it compiles a
    network: under DATA_PARALLEL all but layerwise_parallel ones, under the other parallel modes those no plan
    cut (a sliced parameter's pieces differ by design). One broadcast per dtype, of the parameters concatenated."""
    if not context.get_auto_parallel_context("parameter_broadcast") or parallel_mode() == _PARALLEL.STAND_ALONE:
        return
    from tessel.common.engine import engine
    from tessel.communication import comm_func

    eng = engine()
    if eng.world_size == 1:
        return
    chosen = [p for p in params if (eng.id, p.key) not in _broadcast and not p.layerwise_parallel and not _cut(p)]
    by_dtype: dict[Any, list[Any]] = {}
    for p in chosen:
        by_dtype.setdefault(np.dtype(p.dtype.numpy), []).append(p)
        _broadcast.add((eng.id, p.key))
    for dtype, group in sorted(by_dtype.items(), key=lambda item: item[0].str):
        flat = np.concatenate([np.asarray(p.asnumpy(), dtype).reshape(-1) for p in group])
        received = np.asarray(comm_func.broadcast(flat, src=0))
        offset = 0
        for p in group:
            size = int(np.prod(p.shape, dtype=np.int64))
            p.set_data(received[offset : offset + size].reshape(p.shape))
            offset += size


def _cut(p: Any) -> bool:
    return p.layout is not None and any(s > 1 for s in p.layout.splits)


def _checksum(array: np.ndarray) -> float:
    """48 bits of a digest of shape, dtype and bytes: exact in a float64, equal only for equal values."""
    array = np.ascontiguousarray(array)
    digest = hashlib.blake2b(f"{array.shape}{array.dtype}".encode() + array.tobytes(), digest_size=6).digest()
    return float(int.from_bytes(digest, "little"))


def check_replicas(named: Sequence[tuple[str, np.ndarray]]) -> None:
    """Raise unless every rank holds the same parameters (count, shapes and values) as every other."""
    from tessel.communication import comm_func, get_group_size

    world = get_group_size()
    if world == 1:
        return
    counts = comm_func.all_gather_into_tensor(np.array([len(named)], np.int64))[0].asnumpy().reshape(world)
    if len(set(counts.tolist())) > 1:
        raise ConfigurationError(
            f"data parallel: ranks hold different numbers of parameters ({dict(enumerate(counts.tolist()))}); "
            "every rank must build the same network"
        )
    sums = np.array([_checksum(array) for _, array in named], np.float64)
    gathered = comm_func.all_gather_into_tensor(sums)[0].asnumpy().reshape(world, len(named))
    for index, (name, _) in enumerate(named):
        column = gathered[:, index]
        if np.all(column == column[0]):
            continue
        groups: dict[float, list[int]] = {}
        for rank, value in enumerate(column.tolist()):
            groups.setdefault(value, []).append(rank)
        raise ConfigurationError(
            f"data parallel: parameter {name!r} differs across ranks (ranks grouped by equal value: "
            f"{sorted(groups.values())}); every rank must start from identical parameters: call ms.set_seed(...) "
            "with the same seed on every rank before building the network, and load the same checkpoint"
        )


def warn_unsharded(dataset: Any) -> None:
    """DATA_PARALLEL with a dataset that every rank reads whole trains N times on the same data."""
    node, shards = dataset, None
    while node is not None and shards is None:
        shards = getattr(node, "num_shards", None)
        node = node.children[0] if getattr(node, "children", None) else None
    if not shards or shards == 1:
        warnings.warn(
            f"DATA_PARALLEL over {world_size()} ranks with a dataset that has no num_shards: every rank sees the "
            "same data. Pass num_shards=get_group_size(), shard_id=get_rank() to the dataset source",
            UserWarning,
            stacklevel=3,
        )


# --- sink mode ------------------------------------------------------------------------------------------------


class SinkRunner:
    """Runs a fused train step k steps per Execute with the daemon reading this rank's shard of `dataset`."""

    def __init__(self, step: Any, dataset: Any):
        from tessel.common.engine import engine

        self.step, self.engine = step, engine()
        self.name = f"sink{next(_datasets)}"
        self.batches_per_epoch, self.columns = self.engine.daemon.open_dataset(self.engine.session, self.name, dataset)
        self.first = next(iter(dataset.create_tuple_iterator(num_epochs=1, output_numpy=True)))
        self.entry, self.call = step.prepare(*self.first)
        if any(not call.python for call in self.entry.prints):
            from tessel.common.support import not_supported_yet

            raise not_supported_yet(
                "ops.Print in a network Model.train runs in sink mode",
                "sink mode runs many steps per call and returns only their losses; use dataset_sink_mode=False",
            )
        if self.entry.prints:
            log_once(
                "sink.print",
                "print() of tensors in the network prints nothing in sink mode, which runs many steps per call and "
                "returns only their losses; use dataset_sink_mode=False to see them every step",
            )
        names = [name for name, _ in sorted(self.entry.data, key=lambda item: item[1])]
        from tessel.parallel import pipeline

        if pipeline.current_mesh().pipelined:  # a stage reads only some columns (the labels: the last stage)
            names = [n for n, leaf in zip(self.call.names, self.call.leaves) if hasattr(leaf, "shape")]
        if len(names) != len(self.columns):
            raise ConfigurationError(
                f"sink mode: the network takes {len(names)} data inputs {names} but the dataset has columns "
                f"{self.columns}; map the dataset to exactly the network's inputs"
            )
        self.inputs = names
        self.slices = _batch_slices(getattr(step, "_partition", None), names)

    def run(self, steps: int) -> Iterator[float]:
        """Run `steps` train steps in one Execute, yielding each step's loss as the daemon reports it (so step
        callbacks, LossMonitor's lines and the progress bar follow the steps as they happen; with a timeline being
        recorded, once the Execute has ended)."""
        from tessel.common import parameter as P

        # Asked again each time: what the step compiled in may have changed since (an optimizer's momentum a
        # callback set), and then another entry runs.
        self.entry, self.call = self.step.prepare(*self.first)
        eng, entry = self.engine, self.entry
        prog = eng.expand(entry.program(eng, self.call.batch_size()))
        feed: dict[str, np.ndarray] = {}
        P.stage(eng, entry.params, feed)
        rows: dict[str, np.ndarray] = {}  # inputs that differ from step to step (a per-step learning rate)
        for name, feeder in entry.feeders.items():
            ahead = getattr(feeder, "ahead", None)
            values = ahead(steps) if ahead is not None else None
            if values is None:
                feed[name] = feeder()
            else:
                rows[name] = values
        self.step.before_run(feed)
        loss = entry.host_names[-1]  # the unscaled loss: a scaled step returns (scaled loss, loss)
        batch = daemon_pb2.Instruction(
            next_batch=daemon_pb2.NextBatch(dataset=self.name, outputs=self.inputs, slices=self.slices)
        )
        program = daemon_pb2.Program(instructions=[batch, *prog.instructions])
        eng.runtime.check()
        if profiler.active() is not None:
            result = profiler.execute(
                eng.daemon, eng.session, program, repeat=steps, feed=feed, collect=[loss], per_repetition=rows
            )
            losses = iter(np.asarray(result.collected[loss]).reshape(steps, -1)[:, 0])
        else:
            reports = eng.daemon.execute_steps(
                eng.session, program, steps, feed=feed, collect=[loss], per_repetition=rows
            )
            losses = (np.asarray(report[loss]).reshape(-1)[0] for report in reports)
        P.updated_on_device(entry.assigned)
        ran = 0
        try:
            for value in losses:
                ran += 1
                for hook in entry.after_run:
                    hook()  # the optimizer's step count, as each step ends
                yield float(value)
        finally:  # a loop stopped early: the daemon runs the whole epoch all the same, and the host counts it
            for _ in losses:
                ran += 1
            for _ in range(steps - ran):
                for hook in entry.after_run:
                    hook()


def _batch_slices(partition: Any, names: Sequence[str]) -> list[daemon_pb2.BatchSlice]:
    """Per sunk column, the block of the batch this rank's program reads: a full_batch column the plan reads only in
    slices arrives sliced (the daemon keeps its block of each batch it reads); empty when every column is whole."""
    if partition is None:
        return []
    plan, cuts = partition.plan, []
    inputs = {v.name: v for v in plan.graph.inputs}
    for name in names:
        value = inputs.get(name)
        if value is None or name in plan.parameters:
            cuts.append(daemon_pb2.BatchSlice())
            continue
        layout, full = plan.input_layout(name), tuple(value.shape)
        if dataset_whole() and layout.local_shape(full) != full:
            block = layout.local_slices(full, partition.rank)
            cuts.append(daemon_pb2.BatchSlice(start=[s.start for s in block], stop=[s.stop for s in block]))
        else:
            cuts.append(daemon_pb2.BatchSlice())
    return cuts if any(cut.start for cut in cuts) else []


def dataset_whole() -> bool:
    """Every rank's dataset yields the whole global batch (full_batch=True)."""
    return context.get_auto_parallel_context("dataset_strategy") == "full_batch"
