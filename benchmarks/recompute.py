"""Recomputation: peak memory of MindSpore's recompute sample with and without `Block.recompute()`, side by side.

Usage: python benchmarks/recompute.py [--calls 3] [--repeat 1]

The network is the sample itself (tests/acceptance/mindspore_samples/recompute/example.py: 10 Blocks over an
(8, 128, 16, 32) input, the input's gradient through GradOperation under AutoParallel), run unchanged ("plain")
and with the one line MindSpore's tutorial adds ("recompute": `b.recompute()` on every Block). Each variant runs
in a fresh process (a world of 1: the daemon is embedded, so the process that runs ONNX Runtime is the one
measured), calls the gradient network `--calls` times (the first compiles) and reports:

- the process's peak RSS (ru_maxrss: imports, network, compile and every call), and the rise of RSS during the
  calls after the first (their peak, VmHWM reset after the first call, less the RSS before them): what a step of
  the compiled gradient holds on top of what stays between steps;
- with the daemon's ONNX Runtime settings (memory arena and memory pattern on, as `tessel daemon` runs), and with
  an allocator that tracks live tensors (arena and memory pattern off, glibc's mmap threshold at 64 KiB so that
  every freed tensor goes back to the system): there the rise during a call is the activation memory, what
  MindSpore's "Used peak memory usage" counts (its tutorial: 245M without recompute, 65M with). Freeing every
  tensor to the system makes calls slower: compare times within the first allocator's rows;
- the median time of the calls after the first (recomputation costs about one more forward pass);
- whether the gradients of both variants are bit-identical.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[1] / "tests/acceptance/mindspore_samples/recompute/example.py"
RECOMPUTE_LINE = "            b.recompute()\n"  # the tutorial's one-line change, after `b = Block()`
RUN_LINE = "output = grad_network(input_x)\n"


def sample_source(recompute: bool) -> tuple[str, str]:
    """(the sample up to the gradient call, with the tutorial's change when asked; the call and what follows)."""
    text = SAMPLE.read_text()
    if recompute:
        anchor = "            b = Block()\n"
        if anchor not in text:
            raise SystemExit(f"{SAMPLE}: the line {anchor.strip()!r} the tutorial's change follows is missing")
        text = text.replace(anchor, anchor + RECOMPUTE_LINE)
    if RUN_LINE not in text:
        raise SystemExit(f"{SAMPLE}: the gradient call {RUN_LINE.strip()!r} is missing")
    setup, _, _ = text.partition(RUN_LINE)
    return setup, RUN_LINE


def status_mib(key: str) -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(key)) / 1024


def worker(variant: str, allocator: str, calls: int, out: str) -> None:
    """One variant in this (fresh) process; writes its figures and gradient to `out` (.json, .npy)."""
    import numpy as np

    from tessel.plugins.cpu import compute

    if allocator == "live":
        plain_options = compute.session_options

        def live_options(onnx_bytes: bytes):
            options, disabled = plain_options(onnx_bytes)
            options.enable_cpu_mem_arena = False
            options.enable_mem_pattern = False
            return options, disabled

        compute.session_options = live_options
    setup, _ = sample_source(variant == "recompute")
    scope: dict = {"__name__": "recompute_sample"}
    exec(compile(setup, str(SAMPLE), "exec"), scope)  # imports, the network and its input; nothing runs yet
    baseline = status_mib("VmRSS:")
    times, steady_base = [], None
    for call in range(calls):
        start = time.perf_counter()
        output = scope["grad_network"](scope["input_x"])
        result = output.asnumpy()
        times.append(time.perf_counter() - start)
        if call == 0 and calls > 1:  # the calls after the compile: reset the peak the kernel keeps (VmHWM)
            Path("/proc/self/clear_refs").write_text("5")
            steady_base = status_mib("VmRSS:")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    np.save(out + ".npy", result)
    figures = {"baseline": baseline, "peak": peak, "times": times}
    if steady_base is not None:
        figures.update(steady_base=steady_base, steady_peak=status_mib("VmHWM:"))
    Path(out + ".json").write_text(json.dumps(figures))


def run_variant(variant: str, allocator: str, calls: int, directory: Path) -> dict:
    env = dict(os.environ, TESSEL_THREADS=os.environ.get("TESSEL_THREADS", "1"))
    if allocator == "live":
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    out = str(directory / f"{variant}-{allocator}")
    command = [sys.executable, __file__, "--worker", variant, "--allocator", allocator, "--calls", str(calls)]
    subprocess.run([*command, "--out", out], env=env, check=True)
    figures = json.loads(Path(out + ".json").read_text())
    figures["gradient"] = out + ".npy"
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3, help="gradient calls per process (the first compiles)")
    parser.add_argument("--repeat", type=int, default=1, help="processes per variant (the lowest peak is shown)")
    parser.add_argument("--worker", choices=("plain", "recompute"), help=argparse.SUPPRESS)
    parser.add_argument("--allocator", choices=("daemon", "live"), default="daemon", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.allocator, args.calls, args.out)
        return
    import tempfile

    import numpy as np

    rows = [
        "| ONNX Runtime allocator | variant | process peak RSS | rise during a call | time per call | gradient |",
        "|---|---|---|---|---|---|",
    ]
    labels = {"daemon": "arena + memory pattern (the daemon's)", "live": "live tensors only"}
    with tempfile.TemporaryDirectory() as tmp:
        for allocator in ("daemon", "live"):
            best: dict = {}
            for _ in range(args.repeat):  # alternate the variants so machine noise hits both alike
                for variant in ("plain", "recompute"):
                    figures = run_variant(variant, allocator, args.calls, Path(tmp))
                    if variant not in best or figures["peak"] < best[variant]["peak"]:
                        best[variant] = figures
            same = np.array_equal(np.load(best["plain"]["gradient"]), np.load(best["recompute"]["gradient"]))
            rises = {}
            for variant in ("plain", "recompute"):
                f = best[variant]
                rises[variant] = f.get("steady_peak", f["peak"]) - f.get("steady_base", f["baseline"])
                steady = statistics.median(f["times"][1:]) if len(f["times"]) > 1 else f["times"][0]
                rows.append(
                    f"| {labels[allocator]} | {variant} | {f['peak']:.0f} MiB | {rises[variant]:.0f} MiB | "
                    f"{steady * 1000:.0f} ms | {'identical' if same else 'DIFFERENT'} |"
                )
            ratio = rises["plain"] / max(rises["recompute"], 1e-9)
            rows.append(f"| {labels[allocator]} | plain / recompute | | {ratio:.2f}x | | |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
