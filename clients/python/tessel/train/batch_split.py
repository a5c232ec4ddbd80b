"""Speed-aware data parallelism in `Model.train`: `set_auto_parallel_context(batch_split="speed")` (or fixed weights,
`batch_split=(1, 2)`) under DATA_PARALLEL.

Before each epoch every rank asks the coordinator for the split of the global batch (`BalanceBatch`,
coordinator/balance.py: by the weights, else by the flop/s the daemons measured at registration for the first
epoch and by the job's own step times after that). Rank r then reads shares[r] rows of every global batch
(`tessel.dataset.parallel.with_shares`: the ranks' step-j batches together are the one device's step-j batch) and
its gradients weigh n * shares[r] / B before the mean over the ranks (`rank_step.set_gradient_weight`), so a step
equals one device's step on the global batch (the loss must be a mean over the batch, MindSpore's default
reduction='mean'). Equal shares are MindSpore's even split exactly. Each rank reports, with its next ask, the
seconds its daemon spent on its own work in the epoch (program time less the time blocked in collectives) and
the samples it processed, every epoch. The step of new shares compiles in its own call (CompileSegment), outside
the program time, but the first epoch at a split still runs its programs at new shapes for the first time (on the
emulated devices of benchmarks/heterogeneous.py its own work was 8-24 % above the next epoch's), so the coordinator
holds a new split for one more epoch and takes its points of each rank's step time at its share (two shares: a
fixed + per-row fit) from the epochs after a split's first.

    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True, batch_split="speed")
    model.train(4, dataset)    # log: "batch split for epoch 3: shares 21:43 of 64 (step times of epoch 1 ...)"
"""

from __future__ import annotations

import copy
import logging
import math
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from tessel.common import rank_step
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.dataset.parallel import check_splittable, per_rank_batch, with_shares

log = logging.getLogger("tessel")
_asked: dict[str, int] = {}  # job id -> how many times this rank asked for a split: the coordinator's rounds
# dataset -> (shares, this rank's pipeline for them, the dataset's next epoch once that pipeline ran its last)
_kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# job id -> (busy seconds, samples) of the last epoch of the last Model.train call, reported with the next call's
# first ask (model.train(1, ds) in a loop would otherwise report nothing, and the split would never adapt)
_unreported: dict[str, tuple[float, int]] = {}


def _unit(network: Any) -> int:
    """The rows a rank's share must be a multiple of: the copies and micro-batches its step splits its batch into
    (MicroBatchInterleaved, GradAccumulation / grad_accumulation_step, PipelineCell)."""
    from tessel.nn.wrap import accumulated

    unit = accumulated(network)[1]
    for _, cell in network.cells_and_names():
        for attribute in ("interleave_num", "micro_size"):
            k = cell.__dict__.get(attribute)
            if isinstance(k, int) and k > 1:
                unit = math.lcm(unit, k)
    return unit


def in_units(shares: tuple[int, ...], unit: int) -> tuple[int, ...]:
    """`shares` moved to multiples of `unit` rows with the same sum (largest remainders first, then the lowest
    rank; the same on every rank), each at least `unit`."""
    if unit == 1 or all(s % unit == 0 for s in shares):
        return shares
    total = sum(shares)
    units = [max(1, s // unit) for s in shares]
    extra = total // unit - sum(units)
    order = sorted(range(len(shares)), key=lambda r: (-(shares[r] / unit - units[r]), r))
    for r in order[: max(extra, 0)]:
        units[r] += 1
    while sum(units) > total // unit:  # the minimum of one unit each took more than there was
        r = max(range(len(units)), key=lambda i: (units[i], -i))
        units[r] -= 1
    return tuple(u * unit for u in units)


class BatchSplitter:
    """One training run's uneven split: per epoch, this rank's pipeline and gradient weight."""

    def __init__(self, dataset: Any, setting: Any, unit: int = 1):
        from tessel.common.engine import engine

        self.engine = engine()
        runtime = self.engine.runtime
        self.rank, self.world = runtime.rank, runtime.world_size
        self.weights = () if setting == "speed" else tuple(setting)
        if self.weights and len(self.weights) != self.world:
            raise ConfigurationError(
                f"batch_split={setting!r} gives {len(self.weights)} weights for a job of {self.world} ranks; give "
                "one per rank, or batch_split='speed'"
            )
        if runtime.coordinator is None:
            raise NotSupportedYetError(
                "not supported yet: batch_split without a coordinator (the ranks agree on the split through it); "
                "launch the job with msrun, mpirun or tessel run"
            )
        if len(set(self.weights)) != 1:  # the split may be uneven: refuse now, not at the epoch it first is
            check_splittable(dataset, self.world, self.rank)
        self.dataset, self.unit = dataset, unit
        self.global_batch = per_rank_batch(dataset) * self.world
        self.pipeline: Any = None
        self.samples, self.last = 0, self._load()
        self.unreported = _unreported.pop(runtime.job_id, None)
        self.split = None
        kept = _kept.get(dataset)
        if kept is not None and kept[2] == dataset._next_epoch:  # the last call's pipeline, at this very epoch
            self.split, self.pipeline = kept[0], kept[1]

    def _load(self) -> tuple[float, float]:
        return self.engine.daemon.load(self.engine.session)

    def epoch(self) -> Any:
        """This rank's pipeline for the next epoch (the dataset's next), its gradient weight set for the train step."""
        run_s, blocked_s = self._load()
        ran, blocked = run_s - self.last[0], blocked_s - self.last[1]
        busy = max(0.0, ran - blocked)
        self.last = (run_s, blocked_s)
        samples, self.samples = self.samples, 0
        if not samples and self.unreported is not None:  # the last call's last epoch
            busy, samples = self.unreported
        self.unreported = None
        log.debug("batch split: rank %d ran %.3f s (%.3f s blocked), %d samples", self.rank, ran, blocked, samples)
        runtime = self.engine.runtime
        asked = _asked.get(runtime.job_id, 0)  # the coordinator's round: every rank asks in the same order
        _asked[runtime.job_id] = asked + 1
        split = runtime.coordinator.balance_batch(
            runtime.job_id, self.rank, asked, self.global_batch, self.weights, busy if samples else 0.0, samples
        )
        shares = in_units(tuple(split.shares), self.unit)  # each rank's step splits its share into unit parts
        if self.rank == 0:
            speeds = ":".join(f"{s:.3g}" for s in split.speeds)
            log.info(
                "batch split for epoch %d: shares %s of %d (%s: %s)",
                split.epoch + 1,  # the job's, counted over its Model.train calls
                ":".join(map(str, shares)),
                self.global_batch,
                split.source,
                speeds,
            )
        if shares != self.split:  # a fresh pipeline (in sink mode, a fresh reader on the daemon) at the dataset's epoch
            pipeline = with_shares(self.dataset, shares, self.rank)
            self.pipeline = copy.copy(pipeline) if pipeline is self.dataset else pipeline
        self.split = shares
        # The dataset goes on as the even split's epochs would (the next shuffle order), and so does the pipeline:
        # fed, it claims the same epoch; sunk, its reader reads one epoch after another from the one it opened at.
        self.dataset._claim_epoch()
        # kept for the next Model.train call (model.train(1, ds) in a loop): its first epoch at the same shares goes
        # on with this pipeline, and in sink mode its reader, instead of opening another on the daemon
        _kept[self.dataset] = (shares, self.pipeline, self.dataset._next_epoch)
        rank_step.set_gradient_weight(self.world * shares[self.rank] / self.global_batch)
        return self.pipeline

    def finish(self) -> None:
        """The run ends: its last epoch's busy time and samples wait for the next run's first ask (not the time
        between the runs, an evaluation perhaps, which is no training)."""
        if self.samples:
            run_s, blocked_s = self._load()
            busy = max(0.0, (run_s - self.last[0]) - (blocked_s - self.last[1]))
            _unreported[self.engine.runtime.job_id] = (busy, self.samples)

    def counted(self, steps: Iterator[tuple[Any, Callable]]) -> Iterator[tuple[Any, Callable]]:
        """`steps` (each a batch and its thunk), counting the samples this rank processes in them (reported with the
        next ask)."""
        share = self.split[self.rank]
        for step in steps:
            self.samples += share
            yield step


def splitter(dataset: Any, sink_size: int, network: Any, fused: bool) -> BatchSplitter | None:
    """The splitter Model.train uses, or None for MindSpore's even split. `fused`: the train network runs as the
    built-in fused step, the only one whose gradients the split's weight reaches."""
    from tessel import context

    setting = context.get_auto_parallel_context("batch_split")
    if setting == "even":
        return None
    if not rank_step.data_parallel():
        if rank_step.world_size() == 1:
            return None  # one rank: the whole batch is its share
        raise NotSupportedYetError(
            f"not supported yet: batch_split={setting!r} with parallel_mode={rank_step.parallel_mode()!r}; it splits "
            "the batch of DATA_PARALLEL: set parallel_mode=ParallelMode.DATA_PARALLEL or batch_split='even'"
        )
    if sink_size != -1:
        raise NotSupportedYetError(
            "not supported yet: batch_split with sink_size (the split follows whole epochs); leave sink_size=-1"
        )
    local = [p.name for p in network.get_parameters() if getattr(p, "layerwise_parallel", False)]
    if local:  # reduced by no one, a local parameter's gradient would keep this rank's share weight
        raise NotSupportedYetError(
            f"not supported yet: batch_split={setting!r} with layerwise_parallel parameters {local[:3]}: their "
            "gradients are not averaged over the ranks, so the share weight would scale their updates; use "
            "batch_split='even'"
        )
    if not fused:  # a custom construct (or return_grad=True) reduces its gradients itself: an unweighted mean
        raise NotSupportedYetError(
            f"not supported yet: batch_split={setting!r} with the train network {type(network).__name__}, which "
            "is not the built-in TrainOneStepCell step (it overrides construct, or return_grad=True): its gradient "
            "reduction would average the ranks' uneven shares unweighted, not the one-device gradient. Use "
            "Model(net, loss_fn, optimizer) or a plain TrainOneStepCell, or batch_split='even'"
        )
    return BatchSplitter(dataset, setting, _unit(network))
