"""Run under `tessel run -n N zero_train.py MODE[,MODE...]`: optimizer parallel (levels 1-3 and off) through
Model.train, for SGD, Momentum and Adam, checked on every rank against a float64 numpy reference of 1-rank
training on the global batch: 20 steps' losses to 1e-5, the parameters gathered whole
(tessel.parallel.checkpoint.gather, as save_checkpoint does) and the optimizer state saved whole by save_checkpoint.

MODE: dp (DATA_PARALLEL, set_auto_parallel_context(enable_parallel_optimizer=True, parallel_optimizer_config=...)),
semi (SEMI_AUTO_PARALLEL through AutoParallel(...).hsdp(...): a Megatron MLP cut over 2 model-parallel ranks when
N = 4, data parallel when N = 2), auto (AUTO_PARALLEL, the planner decides), accumulate (DATA_PARALLEL +
GradAccumulation(net, 2) at level2, and grad_accumulation_step=2 at level1: one update per step on the whole
batch, the logged loss the sum of the micro-batches', MindSpore's semantics), semi_loop (value_and_grad +
optimizer(grads) in one AutoParallel step with hsdp: the optimizer state in blocks).
MODE may be a comma-separated list: one job then checks each mode in turn, each on fresh networks.
Prints `zero <mode> <optimizer> <level> ok on rank r of n: loss error E, parameter error P` per configuration.
"""

import os
import sys
import tempfile

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn, ops
from tessel.communication import comm_func, get_group_size, get_rank, init
from tessel.parallel.auto_parallel import AutoParallel
from tessel.parallel.checkpoint import gather
from tessel.parallel.nn import GradAccumulation
from tessel.train import Callback

MODES = sys.argv[1].split(",")  # one job checks each mode in turn (a job start per mode saved)
MODE = MODES[0]
IN, HIDDEN, OUT, STEPS = 12, 16, 8, 20
RATES = {"sgd": 0.2, "momentum": 0.1, "adam": 0.02}

init()
rank, world = get_rank(), get_group_size()
GLOBAL = 4 * world  # rows per step


def initial():
    rng = np.random.default_rng(3)
    shapes = {"w1": (IN, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN, OUT), "b2": (OUT,)}
    return {k: (rng.standard_normal(s) * 0.4).astype(np.float32) for k, s in shapes.items()}


def data():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((STEPS * GLOBAL, IN)).astype(np.float32)
    return x, (np.abs(x[:, :OUT]).argmax(1)).astype(np.int32)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        values = initial()
        self.w1, self.b1 = ms.Parameter(ms.Tensor(values["w1"]), "w1"), ms.Parameter(ms.Tensor(values["b1"]), "b1")
        self.w2, self.b2 = ms.Parameter(ms.Tensor(values["w2"]), "w2"), ms.Parameter(ms.Tensor(values["b2"]), "b2")
        self.matmul1, self.matmul2, self.relu = ops.MatMul(), ops.MatMul(), ops.ReLU()
        if MODE.startswith("semi") and world == 4:  # Megatron over 2 model-parallel ranks, 2 data-parallel copies
            self.matmul1.shard(((2, 1), (1, 2)))
            self.relu.shard(((2, 2),))
            self.matmul2.shard(((2, 2), (2, 1)))

    def construct(self, x):
        return self.matmul2(self.relu(self.matmul1(x, self.w1) + self.b1), self.w2) + self.b2


def reference(optimizer: str):
    """float64 numpy: the optimizer on batches of GLOBAL rows (mean loss); MindSpore's update rules."""
    p = {k: v.astype(np.float64) for k, v in initial().items()}
    slots = {k: [np.zeros_like(a), np.zeros_like(a)] for k, a in p.items()}
    x_all, y_all = data()
    losses, lr = [], RATES[optimizer]
    for step in range(STEPS):
        x, y = x_all[step * GLOBAL : (step + 1) * GLOBAL].astype(np.float64), y_all[step * GLOBAL : (step + 1) * GLOBAL]
        z = x @ p["w1"] + p["b1"]
        h = np.maximum(z, 0)
        logits = h @ p["w2"] + p["b2"]
        e = np.exp(logits - logits.max(1, keepdims=True))
        prob = e / e.sum(1, keepdims=True)
        losses.append(-np.log(prob[np.arange(GLOBAL), y]).mean())
        dlogits = (prob - np.eye(OUT)[y]) / GLOBAL
        dz = dlogits @ p["w2"].T * (z > 0)
        grads = {"w1": x.T @ dz, "b1": dz.sum(0), "w2": h.T @ dlogits, "b2": dlogits.sum(0)}
        for k in p:
            m, v = slots[k]
            if optimizer == "sgd":
                p[k] = p[k] - lr * grads[k]
            elif optimizer == "momentum":
                m[...] = 0.9 * m + grads[k]
                p[k] = p[k] - lr * m
            else:
                m[...] = 0.9 * m + 0.1 * grads[k]
                v[...] = 0.999 * v + 0.001 * grads[k] ** 2
                rate = lr * np.sqrt(1 - 0.999 ** (step + 1)) / (1 - 0.9 ** (step + 1))
                p[k] = p[k] - rate * m / (np.sqrt(v) + 1e-8)
    return p, slots, np.array(losses)


def dataset():
    x, y = data()
    if MODE in ("semi", "auto", "semi_loop"):  # SEMI_AUTO/AUTO: each rank reads its slice of the global batch
        source = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=world, shard_id=rank)
        return source.batch(GLOBAL // world)
    source = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=world, shard_id=rank)
    return source.batch(GLOBAL // world)


class Record(Callback):
    def __init__(self):
        self.losses = []

    def on_train_step_end(self, run_context):
        self.losses.append(float(run_context.original_args().net_outputs.asnumpy()))


def configure(level: str, net):
    """The parallel context (or the AutoParallel wrapper) for `level` ("off" or level1-3)."""
    ms.reset_auto_parallel_context()
    on = level != "off"
    config = {"optimizer_level": level, "parallel_optimizer_threshold": 0} if on else None
    if MODE in ("dp", "accumulate"):
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
        ms.set_auto_parallel_context(enable_parallel_optimizer=on, parallel_optimizer_config=config)
        return net
    if MODE == "auto":
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.AUTO_PARALLEL, search_mode="sharding_propagation")
        ms.set_auto_parallel_context(enable_parallel_optimizer=on, parallel_optimizer_config=config)
        return net
    wrapped = AutoParallel(net, parallel_mode="semi_auto")
    if on:
        wrapped.hsdp(threshold=0, optimizer_level=level)
    return wrapped


def train(optimizer_name: str, level: str, accumulate: int = 1, by_context: bool = False):
    net = Net()
    params = net.trainable_params()
    rate = RATES[optimizer_name]
    optimizer = {
        "sgd": lambda: nn.SGD(params, rate),
        "momentum": lambda: nn.Momentum(params, rate, 0.9),
        "adam": lambda: nn.Adam(params, rate),
    }[optimizer_name]()
    loss_net = nn.WithLossCell(net, nn.CrossEntropyLoss())
    if accumulate > 1 and not by_context:
        loss_net = GradAccumulation(loss_net, accumulate)
    network = configure(level, loss_net)
    if by_context:
        ms.set_auto_parallel_context(grad_accumulation_step=accumulate)
    record = Record()
    ms.Model(network, optimizer=optimizer).train(1, dataset(), callbacks=[record], dataset_sink_mode=True)
    losses = np.array(record.losses)
    if MODE in ("dp", "accumulate"):  # each rank's loss is its slice's; the global batch's is their mean
        losses = comm_func.all_gather_into_tensor(losses)[0].asnumpy().reshape(world, -1).mean(0)
    named = [(p.name, p) for p in params]
    slots = [(p.name, p) for p in optimizer.slot_parameters() if p.name.startswith(("moment", "accum"))]
    return losses / accumulate, dict(gather(named)), dict(gather(slots)), optimizer


def check(optimizer_name: str, level: str, accumulate: int = 1, by_context: bool = False):
    losses, params, slots, optimizer = train(optimizer_name, level, accumulate, by_context)
    want, want_slots, want_losses = reference(optimizer_name)
    loss_error = float(np.abs(losses - want_losses).max() / np.abs(want_losses).max())
    param_error = max(float(np.abs(params[k] - want[k]).max() / np.abs(want[k]).max()) for k in want)
    assert len(losses) == STEPS, losses
    assert loss_error <= 1e-5, f"losses differ from 1-rank training by {loss_error:.2e}: {losses} vs {want_losses}"
    assert param_error <= 1e-5, f"parameters differ from 1-rank training by {param_error:.2e}"
    if optimizer_name != "sgd":  # the optimizer state is whole again once gathered
        first = "moments" if optimizer_name == "momentum" else "moment1"
        for k in want:
            got, ref = slots[f"{first}.{k}"], want_slots[k][0]
            assert np.abs(got - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max()), f"{first}.{k} differs"
    if level != "off" and optimizer_name == "adam" and rank == 0:
        state = next(p for p in optimizer.slot_parameters() if p.name == "moment1.w2")
        assert state.layout is not None, "the optimizer state of a sharded parameter has a block layout"
    tag = f"{level}" + (f" accumulate={accumulate}{' context' if by_context else ''}" if accumulate > 1 else "")
    print(
        f"zero {MODE} {optimizer_name} {tag} ok on rank {rank} of {world}: loss error {loss_error:.1e}, "
        f"parameter error {param_error:.1e}",
        flush=True,
    )
    return params


def check_loop(optimizer_name: str, level: str):
    """value_and_grad + optimizer(grads) inside one AutoParallel step (samples #4, #11): the state sharded over
    the replicas of each parameter when optimizer parallel is on."""
    net = Net()
    params = net.trainable_params()
    rate = RATES[optimizer_name]
    optimizer = nn.Momentum(params, rate, 0.9) if optimizer_name == "momentum" else nn.Adam(params, rate)
    loss_fn = nn.CrossEntropyLoss()
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, optimizer.parameters)

    def step(x, y):
        loss, grads = grad_fn(x, y)
        optimizer(grads)
        return loss

    parallel_step = configure(level, step)
    losses = [float(parallel_step(x, y).asnumpy()) for x, y in dataset().create_tuple_iterator()]
    want, _, want_losses = reference(optimizer_name)
    loss_error = float(np.abs(np.array(losses) - want_losses).max() / np.abs(want_losses).max())
    params_now = dict(gather([(p.name, p) for p in params]))
    param_error = max(float(np.abs(params_now[k] - want[k]).max() / np.abs(want[k]).max()) for k in want)
    assert loss_error <= 1e-5 and param_error <= 1e-5, (loss_error, param_error)
    if level != "off":
        assert any(q.layout is not None and q.layout.splits[0] > 1 for q in optimizer.slot_parameters()), "no block"
    print(f"zero {MODE} loop {optimizer_name} {level} ok on rank {rank} of {world}: loss error {loss_error:.1e}")


def check_switch():
    """One Model trained half its steps without optimizer parallel, then with level3: the parameters become
    blocks on the way, and the 20 steps still equal 1-rank training."""
    net = Net()
    optimizer = nn.Momentum(net.trainable_params(), RATES["momentum"], 0.9)
    model = ms.Model(configure("off", nn.WithLossCell(net, nn.CrossEntropyLoss())), optimizer=optimizer)
    record = Record()
    x, y = data()
    for half, level in enumerate(("off", "level3")):
        if level != "off":
            ms.set_auto_parallel_context(enable_parallel_optimizer=True, parallel_optimizer_config={
                "optimizer_level": level, "parallel_optimizer_threshold": 0})  # fmt: skip
        rows = slice(half * STEPS // 2 * GLOBAL, (half + 1) * STEPS // 2 * GLOBAL)
        part = ds.NumpySlicesDataset({"x": x[rows], "y": y[rows]}, shuffle=False, num_shards=world, shard_id=rank)
        model.train(1, part.batch(GLOBAL // world), callbacks=[record], dataset_sink_mode=half == 0)
    params = dict(gather([(p.name, p) for p in net.trainable_params()]))
    want, _, _ = reference("momentum")
    error = max(float(np.abs(params[k] - want[k]).max() / np.abs(want[k]).max()) for k in want)
    assert error <= 1e-5 and net.w2.layout is not None, error
    print(f"zero {MODE} switch ok on rank {rank} of {world}: parameter error {error:.1e}", flush=True)


def run_mode():
    """Every check of MODE."""
    print(f"zero {MODE} begins on rank {rank} of {world}", flush=True)  # a failure's log shows the mode it hit
    if MODE == "semi_loop":
        for optimizer_name in ("momentum", "adam"):
            for level in ("off", "level1"):
                check_loop(optimizer_name, level)
        return
    if MODE == "accumulate":
        check("adam", "level2", accumulate=2)
        check("momentum", "level1", accumulate=2, by_context=True)
        check("sgd", "off", accumulate=2)
        return
    for optimizer_name in ("sgd", "momentum", "adam"):
        for level in ("off", "level1", "level2", "level3"):
            check(optimizer_name, level)
    # A whole checkpoint of a level3 network: saved gathered, loaded back into a fresh network.
    net = Net()
    network = configure("level3", nn.WithLossCell(net, nn.CrossEntropyLoss()))
    ms.Model(network, optimizer=nn.SGD(net.trainable_params(), RATES["sgd"])).train(
        1, dataset(), dataset_sink_mode=True
    )
    path = os.path.join(tempfile.gettempdir(), f"zero-{MODE}-{os.getppid()}.ckpt")
    ms.save_checkpoint(net, path)
    comm_func.barrier()
    loaded = ms.load_checkpoint(path)
    want, _, _ = reference("sgd")
    for k in want:
        assert np.abs(loaded[k].asnumpy() - want[k]).max() <= 1e-5 * np.abs(want[k]).max(), f"checkpoint {k}"
    comm_func.barrier()  # every rank has read the file before rank 0 removes it
    if rank == 0:
        os.remove(path)
    print(f"zero {MODE} checkpoint ok on rank {rank} of {world}", flush=True)
    if MODE == "dp":  # a predict graph reads the level3 weights whole: all-gathered from the stored blocks
        x = data()[0][:8]
        logits = net(ms.Tensor(x)).asnumpy()
        want_logits = np.maximum(x @ want["w1"] + want["b1"], 0) @ want["w2"] + want["b2"]
        assert np.abs(logits - want_logits).max() <= 1e-4 * np.abs(want_logits).max(), "predict after level3"
        print(f"zero {MODE} predict ok on rank {rank} of {world}", flush=True)
        check_switch()


for MODE in MODES:  # noqa: B007 - the functions above read the mode being checked from this global
    run_mode()
