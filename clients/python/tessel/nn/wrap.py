"""Training wrappers: WithLossCell, WithEvalCell, TrainOneStepCell (a fused step), DistributedGradReducer and
MicroBatchInterleaved (MindSpore's semantics: the sum of the copies' losses)."""

from __future__ import annotations

from typing import Any

from tessel import context
from tessel.common.compiled import CompiledFunction, arg_names_of, rename_inputs
from tessel.common.tensor import Tensor
from tessel.common.tracing import SdkTrace, current
from tessel.communication import GlobalComm
from tessel.compiler import Graph, build_train_step
from tessel.errors import ConfigurationError
from tessel.nn.cell import Cell
from tessel.ops import functional as F


class WithLossCell(Cell):
    """loss_fn(backbone(data), label)."""

    def __init__(self, backbone: Cell, loss_fn: Cell):
        super().__init__(auto_prefix=False)
        self._backbone, self._loss_fn = backbone, loss_fn

    def construct(self, data, label):
        return self._loss_fn(self._backbone(data), label)

    @property
    def backbone_network(self) -> Cell:
        return self._backbone


class WithEvalCell(Cell):
    """(loss, outputs, label) of a network and a loss function, for evaluation."""

    def __init__(self, network: Cell, loss_fn: Cell, add_cast_fp32: bool = False):
        super().__init__(auto_prefix=False)
        self._network, self._loss_fn, self.add_cast_fp32 = network, loss_fn, add_cast_fp32

    def construct(self, data, label):
        outputs = self._network(data)
        if self.add_cast_fp32:
            outputs = F.cast(outputs, "float32")
        return self._loss_fn(outputs, label), outputs, label


class FusedTrainStep:
    """Forward, backward and the optimizer update of a loss network as one compiled graph (`build_train_step`):
    one Execute per step, parameters and optimizer slots updated in place on the daemon.

    `sens` scales the gradients (loss scaling); the step returns the unscaled loss.
    """

    def __init__(self, network: Cell, optimizer, sens: float = 1.0):
        self.network, self.optimizer, self.sens = network, optimizer, float(sens)
        self.compiled = CompiledFunction(
            self._forward,
            f"train_{network.cls_name}",
            params_first=lambda: optimizer.parameters,
            arg_names=arg_names_of(network.construct),
            transform=self._transform,
        )

    def _forward(self, *inputs: Any) -> Any:
        out = self.network(*inputs)
        loss = out[0] if isinstance(out, (tuple, list)) else out
        return (loss * self.sens, loss) if self.sens != 1.0 else loss

    def _transform(self, graph: Graph, trace: SdkTrace) -> tuple[Graph, list]:
        if trace.feeders:
            raise ConfigurationError(
                "the network given to Model/TrainOneStepCell calls an optimizer itself; pass the loss network only"
            )
        opt = self.optimizer
        program = build_train_step(graph, [p.key for p in opt.parameters], opt._rule, opt.no_decay_keys)
        trace.feeders[opt.lr_key] = opt._lr_feed
        trace.after_run.append(opt._advance)
        return rename_inputs(program.graph, opt.rename_map()), opt.slot_parameters()

    def __call__(self, *inputs: Any) -> Tensor:
        out = self.compiled(*inputs)
        return out[1] if self.sens != 1.0 else out


class TrainOneStepCell(Cell):
    """One training step: loss, gradients (scaled by sens), gradient reduction, optimizer update; returns the loss.

    Called directly it runs as one fused graph on the daemon; a subclass that overrides construct is traced (graph
    mode) or run step by step (PYNATIVE_MODE) like any cell.
    """

    def __init__(self, network: Cell, optimizer, sens: float = 1.0, return_grad: bool = False):
        super().__init__(auto_prefix=False)
        from tessel.autograd import GradOperation

        self.network = network
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.grad = GradOperation(get_by_list=True, sens_param=True)
        self.sens = float(sens)
        self.grad_reducer = DistributedGradReducer(self.weights)
        object.__setattr__(self, "_fused", FusedTrainStep(network, optimizer, sens))

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = F.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = self.grad_reducer(grads)
        return F.depend(loss, self.optimizer(grads))

    def __call__(self, *inputs: Any) -> Any:
        if current() is None and type(self).construct is TrainOneStepCell.construct:
            return self._fused(*inputs)
        return super().__call__(*inputs)


class DistributedGradReducer(Cell):
    """Sum (or average, mean=True) gradients over the data-parallel group; the identity on one device."""

    def __init__(
        self,
        parameters: Any,
        mean: bool | None = None,
        degree: int | None = None,
        fusion_type: int = 1,
        group: str = GlobalComm.WORLD_COMM_GROUP,
    ):
        super().__init__(auto_prefix=False)
        self.mean = context.get_auto_parallel_context("gradients_mean") if mean is None else mean
        self.degree, self.group = degree, group

    def __call__(self, grads: Any) -> Any:
        from tessel import communication
        from tessel.common.engine import engine

        engine()
        size = communication.get_group_size(self.group)
        if size == 1:
            return grads
        if current() is not None:
            raise ConfigurationError(
                f"DistributedGradReducer over {size} ranks inside a compiled graph needs the parallel pass; set "
                "set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL) or reduce eagerly"
            )
        from tessel.communication import comm_func

        scale = 1.0 / (self.degree or size) if self.mean else 1.0
        return tuple(Tensor._wrap(comm_func.all_reduce(g.asnumpy(), "sum", self.group) * scale) for g in grads)


class MicroBatchInterleaved(Cell):
    """Split every input along dim 0 into interleave_num parts, run the network on each, return the sum."""

    def __init__(self, network: Cell, interleave_num: int = 2):
        super().__init__(auto_prefix=False)
        if isinstance(interleave_num, bool) or not isinstance(interleave_num, int) or interleave_num < 1:
            raise ConfigurationError(f"MicroBatchInterleaved: interleave_num must be an int >= 1, got {interleave_num}")
        self.network, self.interleave_num = network, interleave_num

    def construct(self, *inputs):
        k, total = self.interleave_num, None
        for i in range(k):
            parts = []
            for x in inputs:
                if isinstance(x, Tensor) and x.ndim >= 1:
                    n = x.shape[0]
                    if isinstance(n, int) and n % k:
                        raise ConfigurationError(f"MicroBatchInterleaved: batch {n} does not split into {k} parts")
                    x = x[i * (n // k) : (i + 1) * (n // k)]
                parts.append(x)
            out = self.network(*parts)
            total = out if total is None else total + out
        return total
