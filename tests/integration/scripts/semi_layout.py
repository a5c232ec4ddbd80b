"""Layouts without running, under SEMI_AUTO_PARALLEL on N ranks (`tessel run -n N semi_layout.py`):
Model.infer_train_layout compiles the train step and returns every parameter's layout (slots included) before any
step runs, Model.infer_predict_layout the same for a predict network, and Cell.compile compiles a sharded cell so
that calling it compiles nothing more. Each rank checks that the slice shapes it was told are the shapes of the
slices it holds after training / predicting, and prints one line."""

from __future__ import annotations

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn, ops
from tessel.common.engine import engine
from tessel.communication import get_group_size, get_rank, init

BATCH, IN, HIDDEN, OUT = 16, 12, 32, 8


class Net(nn.Cell):
    """A Megatron MLP: w1 cut by columns, w2 by rows, dp copies of that."""

    def __init__(self, dp: int, mp: int, seed: int = 3):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w1 = ms.Parameter(ms.Tensor(rng.standard_normal((IN, HIDDEN)).astype(np.float32) * 0.3), name="w1")
        self.w2 = ms.Parameter(ms.Tensor(rng.standard_normal((HIDDEN, OUT)).astype(np.float32) * 0.3), name="w2")
        self.matmul1 = ops.MatMul().shard(((dp, 1), (1, mp)))
        self.relu = ops.ReLU().shard(((dp, mp),))
        self.matmul2 = ops.MatMul().shard(((dp, mp), (mp, 1)))

    def construct(self, x):
        return self.matmul2(self.relu(self.matmul1(x, self.w1)), self.w2)


def check_slices(layout: dict, params, what: str) -> None:
    """The slice shape each parameter's layout tells is the shape of the tensor this rank's daemon holds for it."""
    for p in params:
        held = list(engine().get([p.key])[p.key].shape)
        assert p.name in layout, f"{what}: {p.name} has no layout; got {sorted(layout)}"
        assert layout[p.name][2] == held, f"{what}: {p.name} told {layout[p.name][2]}, holds {held}"
        assert layout[p.name][6] == list(p.shape), f"{what}: {p.name} full shape {layout[p.name][6]} vs {p.shape}"


def counting_compiles():
    eng = engine()
    calls = []
    compile_segment = eng.compile

    def counted(*args, **kwargs):
        calls.append(args[0])
        return compile_segment(*args, **kwargs)

    eng.compile = counted
    return calls


def main() -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    world, rank = get_group_size(), get_rank()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL)
    mp = 2
    dp = world // mp
    rng = np.random.default_rng(11)
    xs = rng.standard_normal((4 * BATCH, IN)).astype(np.float32)
    ys = rng.standard_normal((4 * BATCH, OUT)).astype(np.float32)
    share = BATCH // world

    # Model.infer_train_layout: compiled, nothing run, then the same plan trains.
    net = Net(dp, mp)
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    model = ms.Model(net, nn.MSELoss(), optimizer)
    dataset = ds.NumpySlicesDataset({"x": xs, "y": ys}, shuffle=False, num_shards=world, shard_id=rank).batch(share)
    initial = np.random.default_rng(3).standard_normal((IN, HIDDEN)).astype(np.float32) * 0.3
    layout = model.infer_train_layout(dataset)
    column = HIDDEN // mp
    assert layout["w1"][2] == [IN, column] and layout["w2"][2] == [column, OUT], layout
    assert layout["w1"][1][0] == -1 and layout["w1"][1][1] != -1, layout["w1"]  # w1 cut by columns only
    held = net.w1.asnumpy()  # no step ran: the initial value (whole on the host until the daemon's slice is read)
    mine = initial[:, :column] if rank % mp == 0 else initial[:, column:]
    np.testing.assert_array_equal(held, initial if held.shape == initial.shape else mine)
    compiles = counting_compiles()
    model.train(1, dataset, dataset_sink_mode=True)
    assert not compiles, f"training compiled again after infer_train_layout: {compiles}"
    check_slices(layout, [*net.trainable_params(), *optimizer.slot_parameters()], "infer_train_layout")
    assert [list(p.asnumpy().shape) for p in net.trainable_params()] == [layout["w1"][2], layout["w2"][2]]

    # Model.infer_predict_layout on another sharded network, then predict.
    other = Net(dp, mp, seed=5)
    predictor = ms.Model(other)
    x = ms.Tensor(xs[rank * share : (rank + 1) * share])
    predicted_layout = predictor.infer_predict_layout(x)
    compiles.clear()
    predictor.predict(x)
    assert not compiles, f"predict compiled again after infer_predict_layout: {compiles}"
    check_slices(predicted_layout, other.trainable_params(), "infer_predict_layout")
    assert set(predicted_layout) == {"w1", "w2"}, sorted(predicted_layout)

    # Cell.compile, then a call that compiles nothing.
    third = Net(dp, mp, seed=7)
    third.compile(x)
    compiles.clear()
    third(x)
    assert not compiles, f"the call compiled again after Cell.compile: {compiles}"
    check_slices(third.parameter_layout_dict, third.trainable_params(), "Cell.compile")
    print(f"semi layout ok on rank {rank} of {world}: w1 {layout['w1'][:3]}")


if __name__ == "__main__":
    main()
