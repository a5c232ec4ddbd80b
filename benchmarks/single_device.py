"""One device, one process: tessel's fused train step of the MLP 784-512-512-10 vs a hand-fused ONNX Runtime step.

Usage: python benchmarks/single_device.py [--threads 2] [--batches 32 256] [--seconds 3] [--torch] [--no-sdk]

Both sides run forward + backward + SGD on the same ONNX Runtime build with one global thread pool and
double-buffered IOBindings, so the ratio is what tessel's tracing, autodiff and lowering cost at run time. The
hand-fused graph is written node by node below (Gemm, SoftmaxCrossEntropyLoss, a hand-derived backward).
Rounds alternate between the sides so machine noise hits all alike; figures are medians per step of wall time
and of process CPU time (all threads), the steadier of the two when other work shares the cores.
With --torch, PyTorch's eager step (same threads) is measured too.

The SDK side ("tessel Model.train") is what a user runs: `Model(net, nn.CrossEntropyLoss(), nn.SGD(...)).train()`
over a NumpySlicesDataset of the same batch, through the embedded daemon (one Execute per step), timed end to
end per step (data pipeline, callbacks and the step). Target: at most 1.25x the hand-fused ORT step. The row
"Model.train, sink" is the same with dataset_sink_mode=True: the daemon reads the batches and runs an epoch per
Execute.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DIMS = (784, 512, 512, 10)


def hand_fused_model() -> bytes:
    """Forward, backward and SGD of the MLP written directly in ONNX (weights (out, in), like nn.Dense)."""
    layers = len(DIMS) - 1
    nodes, inits = [], [numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    inits += [numpy_helper.from_array(np.array([0], np.int64), "axis0")]
    inits += [numpy_helper.from_array(np.array([0.0, 1.0], np.float32), "off_on")]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", DIMS[0]]),
        helper.make_tensor_value_info("y", TensorProto.INT64, ["N"]),
        helper.make_tensor_value_info("lr", TensorProto.FLOAT, []),
    ]
    outputs = [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])]
    for i in range(layers):
        for p, shape in (("w", [DIMS[i + 1], DIMS[i]]), ("b", [DIMS[i + 1]])):
            inputs.append(helper.make_tensor_value_info(f"{p}{i}", TensorProto.FLOAT, shape))
            outputs.append(helper.make_tensor_value_info(f"{p}{i}_new", TensorProto.FLOAT, shape))
    acts = ["x"]
    for i in range(layers):
        nodes.append(helper.make_node("Gemm", [acts[-1], f"w{i}", f"b{i}"], [f"z{i}"], transB=1))
        if i < layers - 1:
            nodes.append(helper.make_node("Relu", [f"z{i}"], [f"a{i}"]))
            acts.append(f"a{i}")
    last = f"z{layers - 1}"
    nodes += [
        helper.make_node("SoftmaxCrossEntropyLoss", [last, "y"], ["loss", "log_p"], reduction="mean"),
        helper.make_node("Exp", ["log_p"], ["p"]),
        helper.make_node("Shape", [last], ["classes"], start=1, end=2),
        helper.make_node("Shape", [last], ["rows"], start=0, end=1),
        helper.make_node("OneHot", ["y", "classes", "off_on"], ["target"], axis=-1),
        helper.make_node("Cast", ["rows"], ["rows_f"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["p", "target"], ["residual"]),
        helper.make_node("Div", ["residual", "rows_f"], [f"g{layers - 1}"]),
    ]
    for i in reversed(range(layers)):
        nodes.append(helper.make_node("Gemm", [f"g{i}", acts[i]], [f"dw{i}"], transA=1))
        nodes.append(helper.make_node("ReduceSum", [f"g{i}", "axis0"], [f"db{i}"], keepdims=0))
        if i > 0:
            nodes.append(helper.make_node("MatMul", [f"g{i}", f"w{i}"], [f"da{i}"]))
            # ReLU's backward as a multiply by the mask: ONNX Runtime's Where is ~8x slower than Cast + Mul.
            nodes.append(helper.make_node("Greater", [acts[i], "zero"], [f"mask{i}"]))
            nodes.append(helper.make_node("Cast", [f"mask{i}"], [f"keep{i}"], to=TensorProto.FLOAT))
            nodes.append(helper.make_node("Mul", [f"da{i}", f"keep{i}"], [f"g{i - 1}"]))
        for p in ("w", "b"):
            nodes.append(helper.make_node("Mul", ["lr", f"d{p}{i}"], [f"step_{p}{i}"]))
            nodes.append(helper.make_node("Sub", [f"{p}{i}", f"step_{p}{i}"], [f"{p}{i}_new"]))
    graph = helper.make_graph(nodes, "hand_fused", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def initial_params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    params = {}
    for i in range(len(DIMS) - 1):
        bound = 1 / np.sqrt(DIMS[i])
        params[f"w{i}"] = rng.uniform(-bound, bound, (DIMS[i + 1], DIMS[i])).astype(np.float32)
        params[f"b{i}"] = np.zeros(DIMS[i + 1], np.float32)
    return params


class HandFusedStep:
    def __init__(self, compute, params):
        self.exe = compute.compile(hand_fused_model())
        buffers = [{k: v.copy() for k, v in params.items()} for _ in range(2)]
        self.lr, self.loss = np.array(0.01, np.float32), np.zeros((), np.float32)
        self.bindings = []
        for parity in (0, 1):
            binding = compute.bind(self.exe)
            for name in params:
                binding.input(name, buffers[parity][name])
                binding.output(f"{name}_new", buffers[1 - parity][name])
            binding.input("lr", self.lr)
            binding.output("loss", self.loss)
            self.bindings.append(binding)
        self.parity = 0

    def __call__(self, x, y):
        binding = self.bindings[self.parity]
        binding.input("x", x)
        binding.input("y", y)
        binding.run()
        self.parity = 1 - self.parity
        return self.loss


def tessel_step(compute, params):
    from tessel.compiler.builder import apply
    from tessel.compiler.optimizers import SGD
    from tessel.compiler.tracer import TensorSpec, trace
    from tessel.compiler.train_step import TrainStep, build_train_step

    def mlp(x, y, w0, b0, w1, b1, w2, b2):
        h = x
        for w, b in ((w0, b0), (w1, b1)):
            h = apply("ReLU", apply("MatMul", h, w, transpose_b=True) + b)
        logits = apply("MatMul", h, w2, transpose_b=True) + b2
        return apply("SparseSoftmaxCrossEntropy", logits, y).mean()

    specs = [TensorSpec(("N", DIMS[0])), TensorSpec(("N",), "int64")]
    specs += [TensorSpec(v.shape) for v in params.values()]
    program = build_train_step(trace(mlp, *specs).graph, list(params), SGD(learning_rate=0.01))
    step = TrainStep(program, compute, params)
    return lambda x, y: step(x=x, y=y)


def torch_step(params, threads):
    import torch

    torch.set_num_threads(threads)
    layers = [torch.nn.Linear(DIMS[i], DIMS[i + 1]) for i in range(len(DIMS) - 1)]
    with torch.no_grad():
        for i, layer in enumerate(layers):
            layer.weight.copy_(torch.from_numpy(params[f"w{i}"]))
            layer.bias.copy_(torch.from_numpy(params[f"b{i}"]))
    net = torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1], torch.nn.ReLU(), layers[2])
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        return loss

    return step


class ModelTrain:
    """The SDK path: tessel.Model.train of nn.Dense layers holding `params`, plain SGD, one epoch = `steps` steps."""

    def __init__(self, params: dict[str, np.ndarray], threads: int, steps: int = 50, sink: bool = False):
        os.environ.setdefault("TESSEL_THREADS", str(threads))  # the embedded daemon shares the global ORT pool
        import tessel as ms
        from tessel import nn

        layers = [nn.Dense(DIMS[i], DIMS[i + 1]) for i in range(len(DIMS) - 1)]
        for i, dense in enumerate(layers):
            dense.weight.set_data(params[f"w{i}"])
            dense.bias.set_data(params[f"b{i}"])
        net = nn.SequentialCell(layers[0], nn.ReLU(), layers[1], nn.ReLU(), layers[2])
        self.model = ms.Model(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.01))
        self.steps, self.datasets, self.sink = steps, {}, sink

    def dataset(self, x: np.ndarray, y: np.ndarray):
        import tessel.dataset as ds

        key = (x.shape, x.ctypes.data)
        if key not in self.datasets:
            data = {"x": np.tile(x, (self.steps, 1)), "y": np.tile(y, self.steps)}
            self.datasets[key] = ds.NumpySlicesDataset(data, shuffle=False).batch(len(x))
        return self.datasets[key]

    def measure(self, x: np.ndarray, y: np.ndarray, seconds: float) -> tuple[float, float]:
        """(wall, process CPU) ms per step: medians over epochs of `steps` steps."""
        dataset = self.dataset(x, y)
        self.model.train(1, dataset, dataset_sink_mode=self.sink)  # compile and warm up
        wall, cpu = [], []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline or not wall:
            start, start_cpu = time.perf_counter(), time.process_time()
            self.model.train(1, dataset, dataset_sink_mode=self.sink)
            wall.append((time.perf_counter() - start) / self.steps * 1e3)
            cpu.append((time.process_time() - start_cpu) / self.steps * 1e3)
        return statistics.median(wall), statistics.median(cpu)


def median_ms(step, x, y, seconds: float) -> tuple[float, float]:
    """(wall, process CPU) ms per step, medians over blocks of 10 steps. CPU time is steadier on a busy machine."""
    for _ in range(5):
        step(x, y)
    wall, cpu = [], []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(10):
            step(x, y)
        wall.append((time.perf_counter() - start) / 10 * 1e3)
        cpu.append((time.process_time() - start_cpu) / 10 * 1e3)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per side and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--torch", action="store_true", help="also measure PyTorch's eager step")
    parser.add_argument("--no-sdk", action="store_true", help="skip tessel Model.train through the SDK")
    args = parser.parse_args()

    from tessel.plugins.cpu.compute import CpuCompute

    compute = CpuCompute(threads=args.threads)
    params = initial_params()
    sides = {"tessel": tessel_step(compute, params), "onnxruntime (hand-fused)": HandFusedStep(compute, params)}
    if not args.no_sdk:
        sides["tessel Model.train (SDK)"] = ModelTrain(params, args.threads)
        sides["tessel Model.train, sink"] = ModelTrain(params, args.threads, sink=True)
    if args.torch:
        sides["pytorch (eager)"] = torch_step(params, args.threads)
    rng = np.random.default_rng(1)
    print(f"MLP {'-'.join(map(str, DIMS))}, SGD, {args.threads} threads, median ms/step over {args.rounds} rounds")
    for batch in args.batches:
        x = rng.standard_normal((batch, DIMS[0])).astype(np.float32)
        y = rng.integers(0, DIMS[-1], batch).astype(np.int64)
        results = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, step in sides.items():
                share = args.seconds / args.rounds
                measured = step.measure(x, y, share) if isinstance(step, ModelTrain) else median_ms(step, x, y, share)
                results[name].append(measured)
        wall = {name: statistics.median(r[0] for r in rs) for name, rs in results.items()}
        cpu = {name: statistics.median(r[1] for r in rs) for name, rs in results.items()}
        base = "onnxruntime (hand-fused)"
        for name in sides:
            print(
                f"  B={batch:<4} {name:<26} wall {wall[name]:7.3f} ms ({wall[name] / wall[base]:4.2f}x)   "
                f"cpu {cpu[name]:7.3f} ms ({cpu[name] / cpu[base]:4.2f}x hand-fused ORT)"
            )


if __name__ == "__main__":
    main()
