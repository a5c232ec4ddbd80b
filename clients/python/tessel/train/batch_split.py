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

import logging
from collections.abc import Callable, Iterator
from typing import Any

from tessel.common import rank_step
from tessel.core.errors import ConfigurationError, NotSupportedYetError
from tessel.dataset.parallel import per_rank_batch, with_shares

log = logging.getLogger("tessel")


class BatchSplitter:
    """One training run's uneven split: per epoch, this rank's pipeline and gradient weight."""

    def __init__(self, dataset: Any, setting: Any):
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
        self.dataset = dataset
        self.global_batch = per_rank_batch(dataset) * self.world
        self.pipelines: dict[tuple[int, ...], Any] = {}
        self.samples, self.last = 0, self._load()
        self.split = None

    def _load(self) -> tuple[float, float]:
        return self.engine.daemon.load(self.engine.session)

    def epoch(self, index: int) -> Any:
        """This rank's pipeline for epoch `index` (0-based), its gradient weight set for the train step."""
        run_s, blocked_s = self._load()
        ran, blocked = run_s - self.last[0], blocked_s - self.last[1]
        busy = max(0.0, ran - blocked)
        self.last = (run_s, blocked_s)
        samples, self.samples = self.samples, 0
        log.debug("batch split: rank %d ran %.3f s (%.3f s blocked), %d samples", self.rank, ran, blocked, samples)
        runtime = self.engine.runtime
        split = runtime.coordinator.balance_batch(
            runtime.job_id, self.rank, index, self.global_batch, self.weights, busy if samples else 0.0, samples
        )
        self.split = shares = tuple(split.shares)
        if self.rank == 0:
            speeds = ":".join(f"{s:.3g}" for s in split.speeds)
            log.info(
                "batch split for epoch %d: shares %s of %d (%s: %s)",
                index + 1,
                ":".join(map(str, shares)),
                self.global_batch,
                split.source,
                speeds,
            )
        pipeline = self.pipelines.get(shares)
        if pipeline is None:
            pipeline = self.pipelines[shares] = with_shares(self.dataset, shares, self.rank)
        pipeline.resume_at_epoch(index)
        rank_step.set_gradient_weight(self.world * shares[self.rank] / self.global_batch)
        return pipeline

    def counted(self, steps: Iterator[Callable]) -> Iterator[Callable]:
        """`steps`, counting the samples this rank processes in them (reported with the next ask)."""
        share = self.split[self.rank]
        for step in steps:
            self.samples += share
            yield step


def splitter(dataset: Any, sink_size: int) -> BatchSplitter | None:
    """The splitter Model.train uses, or None for MindSpore's even split."""
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
    return BatchSplitter(dataset, setting)
