"""Run under `tessel run -n N pipeline_train.py FLOW SCHEDULER STAGES [options] [+ FLOW SCHEDULER STAGES ...]`: an MLP
cut into STAGES pipeline stages (each Dense layer's pipeline_stage), micro-batches by nn.PipelineCell, trained STEPS
steps with SGD; every rank checks every step's loss and, at the end, the parameters it holds against a float64 numpy
reference of ONE device training the same network on the same micro-batches (micro-batch i = rows i, i + M, ... of
the global batch; the loss is the sum of the micro-batches' mean cross-entropies; gradients are summed over them).
FLOW: model (Model.train, sink mode), step (TrainOneStepCell called per batch), jit (value_and_grad +
PipelineGradReducer + optimizer under @ms.jit, as MindSpore's pipeline tutorial) or auto (the jit step wrapped in
AutoParallel(...).pipeline(stages, interleave, scheduler)). SCHEDULER: 1f1b, gpipe or zero_bubble_h1. Options:
`micro=M` (default 4), `interleave` (pipeline_interleave: the layers' stages go 0, 1, .., S-1, 0, 1, ..), `mp` (the
first Dense layer cut by columns over the stage's ranks), `steps=K` (default 20), `tied` (the last layer also reads
the first layer's weight: a parameter of two stages), `die=K` (the last rank exits at step K: the others must fail,
not hang), `stage_of=a,b,c,d` (the layers' stages, given: for the error checks), `batch=B` (rows per rank), `zero`
(enable_parallel_optimizer=True too: an error, not supported yet), `relu_stage` (every layer on stage 0 and a last
ReLU cell alone on stage 1: a stage without parameters), `infer` (after training, `net(x)` on every rank equals
numpy's forward with the trained parameters), `ckpt=DIR` (after training, save_checkpoint(net) writes every
parameter whole, gathered from the stages that hold them), `sync` (with `tied`, after training: the ranks of the
last stage set their copy of the shared weight to zeros, then ms.sync_pipeline_shared_parameters(net) gives every
holder the first stage's value again). The ranks of one stage share the batch (data parallel inside the stage).
Cases joined by `+` train one after another in one job (a job start per case saved), each from a fresh network and
parallel context. Prints `pipeline <flow> <scheduler> ok on rank r of n: loss error E, parameter error P`."""

import os
import sys

import numpy as np

import tessel as ms
import tessel.dataset as ds
from tessel import nn, ops
from tessel.communication import get_group_size, get_rank, init
from tessel.train import Callback

CASES = [[]]  # `FLOW SCHEDULER STAGES [options] + FLOW ...`: one case after another in this job
for word in sys.argv[1:]:
    if word == "+":
        CASES.append([])
    else:
        CASES[-1].append(word)
WIDTHS, LR = (12, 16, 16, 16, 6), 0.2
LAYERS = len(WIDTHS) - 1

ms.set_context(mode=ms.GRAPH_MODE)
init()
rank, world = get_rank(), get_group_size()


def configure(case: list[str]) -> None:
    """The case's settings (module globals, read by the functions below) and its parallel context."""
    global FLOW, SCHEDULER, STAGES, OPTIONS, MICRO, STEPS, INTERLEAVE, MODEL_PARALLEL, TIED, per_stage, GLOBAL_BATCH
    FLOW, SCHEDULER, STAGES = case[0], case[1], int(case[2])
    OPTIONS = dict(a.split("=") if "=" in a else (a, "1") for a in case[3:])
    MICRO, STEPS = int(OPTIONS.get("micro", 4)), int(OPTIONS.get("steps", 20))
    INTERLEAVE, MODEL_PARALLEL, TIED = "interleave" in OPTIONS, "mp" in OPTIONS, "tied" in OPTIONS
    per_stage = world // STAGES
    GLOBAL_BATCH = int(OPTIONS.get("batch", 4 * MICRO)) * per_stage  # rows of one step over a stage's ranks
    ms.reset_auto_parallel_context()  # nothing of the previous case carries over
    config = {"pipeline_interleave": INTERLEAVE, "pipeline_scheduler": SCHEDULER}
    if FLOW != "auto":
        ms.set_auto_parallel_context(
            parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, pipeline_stages=STAGES, pipeline_config=config
        )
    if "zero" in OPTIONS:  # optimizer parallel as well: not supported yet with pipeline stages
        ms.set_auto_parallel_context(enable_parallel_optimizer=True)
    ms.set_seed(7)


def stage_of(layer: int) -> int:
    """0, 0, 1, 1 for 4 layers on 2 stages; 0, 1, 0, 1 interleaved (2 chunks); or as `stage_of=` says."""
    if "stage_of" in OPTIONS:
        return int(OPTIONS["stage_of"].split(",")[layer])
    return layer % STAGES if INTERLEAVE else layer * STAGES // LAYERS


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.layers = nn.CellList([nn.Dense(WIDTHS[i], WIDTHS[i + 1]) for i in range(LAYERS)])
        self.relu = ops.ReLU()
        if MODEL_PARALLEL:
            self.layers[0].matmul.shard(((1, 1), (per_stage, 1)))
        if TIED:
            self.total = ops.ReduceSum()
        for i, layer in enumerate(self.layers):
            layer.pipeline_stage = stage_of(i)
        if "relu_stage" in OPTIONS:  # every layer on stage 0, a last ReLU alone on stage 1: a stage of no parameters
            self.last = nn.ReLU()
            self.last.pipeline_stage = 1
            for layer in self.layers:
                layer.pipeline_stage = 0

    def construct(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < LAYERS - 1:
                x = self.relu(x)
        if TIED:  # the last stage reads layer 0's weight too
            x = x + self.total(self.layers[0].weight) * 0.001
        if "relu_stage" in OPTIONS:
            x = self.last(x)
        return x


def batches():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((STEPS * GLOBAL_BATCH, WIDTHS[0])).astype(np.float32)
    return x, (np.abs(x[:, : WIDTHS[-1]]).argmax(1)).astype(np.int32)


def reference(initial: dict[str, np.ndarray]):
    """Float64: each step's loss (before its update) and the parameters after the last step, on one device."""
    w = [initial[f"layers.{i}.weight"].astype(np.float64) for i in range(LAYERS)]
    b = [initial[f"layers.{i}.bias"].astype(np.float64) for i in range(LAYERS)]
    x_all, y_all = batches()
    losses = []
    for step in range(STEPS):
        rows = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        gw, gb, total = [0.0] * LAYERS, [0.0] * LAYERS, 0.0
        for m in range(MICRO):
            x, y = x_all[rows][m::MICRO].astype(np.float64), y_all[rows][m::MICRO]
            acts, h = [x], x
            for i in range(LAYERS):  # nn.Dense: x @ W^T + b
                h = h @ w[i].T + b[i]
                if i < LAYERS - 1:
                    h = np.maximum(h, 0)
                acts.append(h)
            if TIED:
                h = h + w[0].sum() * 0.001
            p = np.exp(h - h.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            total += -np.log(p[np.arange(len(y)), y]).mean()
            g = p.copy()
            g[np.arange(len(y)), y] -= 1
            g /= len(y)
            if TIED:
                gw[0] = gw[0] + 0.001 * g.sum() * np.ones_like(w[0])
            for i in reversed(range(LAYERS)):
                if i < LAYERS - 1:
                    g = g * (acts[i + 1] > 0)
                gw[i] = gw[i] + g.T @ acts[i]
                gb[i] = gb[i] + g.sum(0)
                g = g @ w[i]
        losses.append(total)
        w = [wi - LR * gi for wi, gi in zip(w, gw)]
        b = [bi - LR * gi for bi, gi in zip(b, gb)]
    final = {f"layers.{i}.weight": w[i] for i in range(LAYERS)} | {f"layers.{i}.bias": b[i] for i in range(LAYERS)}
    return losses, final


def run_case(case: list[str]) -> None:
    """Train the configured case and check it."""
    print(f"pipeline case {' '.join(case)} begins on rank {rank} of {world}", flush=True)  # a failure's log names it
    net = Net()
    initial = {p.name: np.array(p.asnumpy()) for p in net.trainable_params()}
    want_losses, want_params = reference(initial)
    loss_net = nn.PipelineCell(
        nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")), MICRO
    )
    optimizer = nn.SGD(net.trainable_params(), LR)
    x_all, y_all = batches()
    share = GLOBAL_BATCH // per_stage
    mine = rank % per_stage  # this rank's place in its stage: its share of every batch

    def local(step: int):
        rows = slice(step * GLOBAL_BATCH + mine * share, step * GLOBAL_BATCH + (mine + 1) * share)
        return ms.Tensor(x_all[rows]), ms.Tensor(y_all[rows])

    losses = []
    if FLOW == "model":

        class Record(Callback):
            def on_train_step_end(self, run_context):
                losses.append(float(run_context.original_args().net_outputs.asnumpy()))

        pick = np.concatenate([np.arange(s * GLOBAL_BATCH + mine * share, s * GLOBAL_BATCH + (mine + 1) * share)
                               for s in range(STEPS)])  # fmt: skip
        dataset = ds.NumpySlicesDataset({"x": x_all[pick], "y": y_all[pick]}, shuffle=False).batch(share)
        ms.Model(loss_net, optimizer=optimizer).train(1, dataset, callbacks=[Record()], dataset_sink_mode=True)
    elif FLOW == "step":
        step_cell = nn.TrainOneStepCell(loss_net, optimizer)
        for s in range(STEPS):
            if s == int(OPTIONS.get("die", -1)) and rank == world - 1:
                os._exit(7)  # a rank that dies in the middle of training
            losses.append(float(step_cell(*local(s)).asnumpy()))
    else:
        grad_fn = ms.value_and_grad(lambda x, y: loss_net(x, y), None, optimizer.parameters)
        reducer = nn.PipelineGradReducer(optimizer.parameters)

        def train_one_step(x, y):
            loss, grads = grad_fn(x, y)
            grads = reducer(grads)
            optimizer(grads)
            return loss

        if FLOW == "auto":
            from tessel.parallel.auto_parallel import AutoParallel

            step_fn = AutoParallel(train_one_step, parallel_mode="semi_auto")
            step_fn.pipeline(stages=STAGES, interleave=INTERLEAVE, scheduler=SCHEDULER)
        else:
            step_fn = ms.jit(train_one_step)
        for s in range(STEPS):
            losses.append(float(step_fn(*local(s)).asnumpy()))

    assert len(losses) == STEPS, losses
    loss_error = max(abs(a - b) / abs(b) for a, b in zip(losses, want_losses))
    assert loss_error <= 1e-5, (losses, want_losses)
    param_error, held = 0.0, 0
    for p in net.trainable_params():
        if not p.held:
            continue
        held += 1
        got, want = p.asnumpy().astype(np.float64), want_params[p.name]
        if p.layout is not None:  # a slice of the parameter (model parallel inside the stage)
            from tessel.compiler.parallel import piece

            want = piece(want, p.layout, mine)
        param_error = max(param_error, float(np.abs(got - want).max() / max(1.0, np.abs(want).max())))
    assert held and param_error <= 1e-5, param_error
    if "ckpt" in OPTIONS:  # every rank saves: one file with every parameter, whole, whichever stage holds it
        path = os.path.join(OPTIONS["ckpt"], "net.ckpt")
        ms.save_checkpoint(net, path)
        from tessel.communication import comm_func

        comm_func.barrier()  # rank 0 writes the file
        saved = ms.load_checkpoint(path)
        for name, want in want_params.items():
            got = saved[name].asnumpy().astype(np.float64)
            assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), name
    if "sync" in OPTIONS:  # a shared weight changed on one stage is synchronized from the first stage holding it
        shared = net.layers[0].weight
        if rank // per_stage == STAGES - 1:
            assert shared.held, "the tied weight is read on the last stage"
            shared.set_data(ms.Tensor(np.zeros(shared.shape, np.float32)))
            assert not shared.asnumpy().any()
        ms.sync_pipeline_shared_parameters(net)
        if shared.held:
            got, want = shared.asnumpy().astype(np.float64), want_params["layers.0.weight"]
            assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), "the shared weight is not in sync"
    if "infer" in OPTIONS:  # after training, the network alone (no PipelineCell): one micro-batch through the stages
        x = x_all[:share].astype(np.float64)
        for i in range(LAYERS):
            x = x @ want_params[f"layers.{i}.weight"].T + want_params[f"layers.{i}.bias"]
            x = np.maximum(x, 0) if i < LAYERS - 1 else x
        logits = net(ms.Tensor(x_all[:share])).asnumpy()
        infer_error = float(np.abs(logits - x).max() / max(1.0, np.abs(x).max()))
        assert infer_error <= 1e-5, infer_error
    print(f"pipeline {FLOW} {SCHEDULER} ok on rank {rank} of {world}: loss error {loss_error:.2e}, parameter error "
          f"{param_error:.2e}, {held} parameters held")  # fmt: skip


for case in CASES:
    configure(case)
    run_case(case)
