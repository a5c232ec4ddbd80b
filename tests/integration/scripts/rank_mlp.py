"""Run under `tessel run -n N`: rank programs on the daemons, checked against single-device references.

1. Manual tensor parallelism (MindSpore's measured semantics): W1 split by columns, W2 by rows, AllReduce of the
   partial logits. The loss equals the single-device numpy loss, and the first SGD update of every W1/b1/W2 slice
   is N times the single-device one (AllReduce' = AllReduce); the replicated b2 moves 1 times. With 4 ranks the
   check also runs on two pairs, (0, 1) and (2, 3), which the program creates as groups.
2. Data parallelism: 20 Momentum steps with gradients all-reduced (mean) in >= 2 buckets overlapping the
   backward equal 1-rank training on the N-times batch (in-process TrainStep) to <= 1e-5 relative.

Prints one "... ok on rank r of n" line per check; any failure raises (a non-zero exit).
"""

import numpy as np

from tessel.communication import get_group_size, get_rank, init
from tessel.communication import runtime as _runtime
from tessel.compiler import (
    SGD,
    Momentum,
    TensorSpec,
    TrainStep,
    apply,
    build_train_step,
    data_parallel_train_step,
    lower_rank_program,
    mirror_parameters,
    plan_buckets,
    trace,
)
from tessel.plugins.cpu.compute import CpuCompute

IN, HIDDEN, OUT = 6, 24, 4  # HIDDEN divides by 2, 3 and 4
init()
rank, world = get_rank(), get_group_size()
daemon, session = _runtime.current().daemon, _runtime.current().session_id


def full_params(seed):
    rng = np.random.default_rng(seed)
    shapes = {"w1": (IN, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN, OUT), "b2": (OUT,)}
    return {k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in shapes.items()}


def batch(step, rows):
    rng = np.random.default_rng(1000 + step)
    x = rng.standard_normal((rows, IN)).astype(np.float32)
    return x, ((x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0.5).astype(np.int32) + (x[:, 2] > 1).astype(np.int32))


def numpy_loss_and_grads(p, x, y):
    p = {k: v.astype(np.float64) for k, v in p.items()}
    z = x @ p["w1"] + p["b1"]
    h = np.maximum(z, 0)
    logits = h @ p["w2"] + p["b2"]
    e = np.exp(logits - logits.max(1, keepdims=True))
    prob = e / e.sum(1, keepdims=True)
    dlogits = (prob - np.eye(OUT)[y]) / len(y)
    dz = dlogits @ p["w2"].T * (z > 0)
    loss = -np.log(prob[np.arange(len(y)), y]).mean()
    return loss, {"w1": x.T @ dz, "b1": dz.sum(0), "w2": h.T @ dlogits, "b2": dlogits.sum(0)}


def tensor_parallel(group):
    n, index, lr = len(group), group.index(rank), 0.5
    k = HIDDEN // n

    def forward(x, y, w1, b1, w2, b2):
        h = apply("ReLU", x @ w1 + b1)
        logits = apply("AllReduce", h @ w2, group=group) + b2
        return apply("SparseSoftmaxCrossEntropy", logits, y).mean()

    specs = [TensorSpec(("N", IN)), TensorSpec(("N",), "int32"), TensorSpec((IN, k)), TensorSpec((k,)),
             TensorSpec((k, OUT)), TensorSpec((OUT,))]  # fmt: skip
    train = build_train_step(trace(forward, *specs).graph, ["w1", "b1", "w2", "b2"], SGD(learning_rate=lr))
    program = lower_rank_program(train.graph, state=[s.name for s in train.state], world_size=world)
    full, cols = full_params(0), slice(index * k, (index + 1) * k)
    mine = {"w1": full["w1"][:, cols], "b1": full["b1"][cols], "w2": full["w2"][cols], "b2": full["b2"]}
    installed = daemon.install(program, session, initial={**mine, "learning_rate": np.float32(lr)})
    x, y = batch(0, 16)
    loss = installed.run(feed={"x": x, "y": y}).fetched[program.outputs[0]]
    want_loss, grads = numpy_loss_and_grads(full, x.astype(np.float64), y)
    assert abs(loss - want_loss) <= 1e-5 * abs(want_loss), f"loss {loss} != single-device {want_loss}"
    after, single = installed.state(), {"w1": grads["w1"][:, cols], "b1": grads["b1"][cols], "w2": grads["w2"][cols]}
    ratios = []
    for name, grad in single.items():
        moved = (mine[name].astype(np.float64) - after[name]) / lr
        np.testing.assert_allclose(moved, n * grad, rtol=1e-3, atol=1e-5, err_msg=f"{name} update")
        ratios.append(np.sum(moved * grad) / np.sum(grad * grad))
    np.testing.assert_allclose((full["b2"] - after["b2"]) / lr, grads["b2"], rtol=1e-3, atol=1e-5)
    print(f"tensor parallel ok on rank {rank} of {world}: group {group} update ratio {np.mean(ratios):.6f} "
          f"({dict(program.collective_counts())})", flush=True)  # fmt: skip


def data_parallel():
    per_rank, optimizer, params = 4, Momentum(learning_rate=0.1, momentum=0.9), full_params(7)

    def forward(x, y, w1, b1, w2, b2):
        h = apply("ReLU", x @ w1 + b1)
        return apply("SparseSoftmaxCrossEntropy", h @ w2 + b2, y).mean()

    specs = [TensorSpec(("N", IN)), TensorSpec(("N",), "int32"), TensorSpec((IN, HIDDEN)), TensorSpec((HIDDEN,)),
             TensorSpec((HIDDEN, OUT)), TensorSpec((OUT,))]  # fmt: skip
    graph, names = trace(forward, *specs).graph, ["w1", "b1", "w2", "b2"]
    group, cap = tuple(range(world)), 512  # b2, w2 and b1 share a bucket (496 bytes), w1 has its own
    train = data_parallel_train_step(graph, names, optimizer, group, mean=True, bucket_bytes=cap)
    program = lower_rank_program(train.graph, state=[s.name for s in train.state], world_size=world)
    buckets = program.collective_counts()["ALL_REDUCE"]
    planned = plan_buckets(build_train_step(mirror_parameters(graph, names, group), names, optimizer).graph, cap)
    largest = max(len(b.reductions) for b in planned)
    assert buckets == len(planned) >= 2 and largest >= 2, program.dump()
    initial = {s.name: params[s.name] if s.init is None else np.full(s.shape, s.init, s.dtype.numpy)
               for s in train.state}  # fmt: skip
    installed = daemon.install(program, session, initial={**initial, "learning_rate": np.float32(0.1)})
    reference = TrainStep(build_train_step(graph, names, optimizer), CpuCompute(1), params)
    rows = slice(rank * per_rank, (rank + 1) * per_rank)
    for step in range(20):
        x, y = batch(step, per_rank * world)
        want = reference(x=x, y=y)
        installed.run(feed={"x": x[rows], "y": y[rows]})
    worst = 0.0
    for name, value in installed.state(names).items():
        ref = reference.state[name]
        worst = max(worst, float(np.abs(value - ref).max() / np.abs(ref).max()))
    assert worst <= 1e-5, f"parameters differ from 1-rank training by {worst:.2e} relative after 20 steps"
    print(f"data parallel ok on rank {rank} of {world}: {buckets} buckets (up to {largest} tensors), "
          f"relative error {worst:.1e}, "
          f"last loss {float(want):.4f}", flush=True)  # fmt: skip


tensor_parallel(tuple(range(world)))
if world == 4:
    tensor_parallel((0, 1) if rank < 2 else (2, 3))
data_parallel()
