"""Compiled ONNX segments on a session. State inputs (parameters, optimizer slots) are double-buffered:
one binding reads buffer A and writes the model's "<name>/new" output into B, the next does the reverse, so
updates land in place with no copies, and the session's store always names the current buffer. State the model
names in its "tessel.inplace" metadata (compiler/memory.py: every reader runs before the element-wise op writing
the new value) has one buffer, read and written by the same run.

After a run the binding lets go of large inputs that are not state (a gathered weight, an activation), so that
freeing them from the store frees their memory; they are bound again on the next run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tessel.core.errors import ConfigurationError

NEW = "/new"
INPLACE_KEY = "tessel.inplace"  # the metadata entry compiler/memory.py writes
RELEASE_BYTES = 1 << 20  # inputs from this size on are not kept bound between runs


class Segment:
    def __init__(self, name: str, compute: Any, onnx_model: bytes, state: Sequence[str] = ()):
        self.name, self.compute = name, compute
        self.exe = compute.compile(onnx_model)
        inputs, outputs = set(self.exe.input_names), set(self.exe.output_names)
        unknown = [s for s in state if s not in inputs]
        if unknown:
            raise ConfigurationError(
                f"segment {name!r}: state {unknown} are not inputs of the model (inputs: {sorted(inputs)})"
            )
        self.state = tuple(state)
        self.updated = tuple(s for s in state if s + NEW in outputs)
        marked = getattr(self.exe, "metadata", {}).get(INPLACE_KEY, "")
        self.inplace = frozenset(marked.split(",")) & frozenset(self.updated) if marked else frozenset()
        self.data = tuple(n for n in self.exe.input_names if n not in self.state)
        self._buffers: dict[str, list[np.ndarray]] = {}
        self._placed: dict[str, np.ndarray] = {}  # outputs written into buffers given by place()
        self._bindings: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._parity = 0
        self._bindable = hasattr(compute, "bind")

    def run(self, tensors: dict[str, np.ndarray], inputs: Sequence[str], outputs: Sequence[str]) -> None:
        """Run on the store `tensors`: read inputs (default: the model's data inputs), write `outputs`, update state."""
        names = tuple(inputs) or self.data
        missing = [n for n in (*names, *self.state) if n not in tensors]
        if missing:
            raise ConfigurationError(f"segment {self.name!r} needs tensors {missing}; put them first")
        if not self._bindable:
            self._run_plain(tensors, names, outputs)
            return
        self._sync_buffers(tensors)
        binding = self._binding(self._parity, tuple(outputs), tensors)
        for name in names:
            binding.input(name, _contiguous(tensors[name]))
        values = iter(binding.run())
        forget = getattr(binding, "forget", None)
        if forget is not None:
            for name in names:
                if tensors[name].nbytes >= RELEASE_BYTES:
                    forget(name)
        self._parity = 1 - self._parity
        for name in self.updated:
            buffers = self._buffers[name]
            tensors[name] = buffers[self._parity % len(buffers)]
        placed = self._placed
        for name in outputs:
            tensors[name] = placed[name] if name in placed else next(values)

    def output_port(self, name: str) -> Any:
        """The model's output `name` (name, dtype, shape), or None."""
        ports = getattr(self.exe, "outputs", ())
        return next((p for p in ports if p.name == name), None)

    def place(self, name: str, array: np.ndarray) -> None:
        """Write output `name` into `array` on every run from now on (a view of a gradient bucket's buffer);
        the array must have the output's static shape and dtype."""
        port = self.output_port(name)
        if port is None or tuple(port.shape) != array.shape or port.dtype != array.dtype:
            raise ConfigurationError(
                f"segment {self.name!r}: cannot place output {name!r} into a {array.dtype}{list(array.shape)} "
                f"buffer; the model's output is {port and (str(port.dtype) + str(list(port.shape)))}"
            )
        if self._bindable:
            self._placed[name] = array
            self._bindings.clear()

    def _run_plain(self, tensors: dict, names: tuple[str, ...], outputs: Sequence[str]) -> None:
        feeds = {n: tensors[n] for n in (*names, *self.state)}
        values = dict(zip(self.exe.output_names, self.compute.run(self.exe, feeds)))
        for name in self.updated:
            tensors[name] = values[name + NEW]
        for name in outputs:
            tensors[name] = values[name]

    def _sync_buffers(self, tensors: dict[str, np.ndarray]) -> None:
        # A state tensor replaced in the store (a checkpoint load, a put) becomes the new current buffer.
        for name in self.updated:
            current = tensors[name]
            buffers = self._buffers.get(name)
            if buffers is not None and buffers[self._parity % len(buffers)] is current:
                continue
            if name in self.inplace:
                # The store's own array becomes the buffer when nothing else can see it: no copy of a large state.
                owned = current.flags.owndata and current.flags.writeable and current.flags.c_contiguous
                first = current if owned else np.array(current, order="C", copy=True)
                self._buffers[name] = [first]
            else:
                first = np.array(current, order="C", copy=True)
                pair = [first, np.empty_like(first)] if self._parity == 0 else [np.empty_like(first), first]
                self._buffers[name] = pair
            tensors[name] = first
            self._bindings.clear()

    def _binding(self, parity: int, outputs: tuple[str, ...], tensors: dict[str, np.ndarray]) -> Any:
        key = (parity, outputs)
        if key not in self._bindings:
            binding = self.compute.bind(self.exe)
            for name in self.state:
                if name in self._buffers:
                    buffers = self._buffers[name]
                    binding.input(name, buffers[parity % len(buffers)])
                    binding.output(name + NEW, buffers[(1 - parity) % len(buffers)])
                else:
                    binding.input(name, _contiguous(tensors[name]))
            for name in outputs:
                binding.output(name, self._placed.get(name))
            self._bindings[key] = binding
        return self._bindings[key]


def _contiguous(array: np.ndarray) -> np.ndarray:
    # np.ascontiguousarray would turn a 0-d array (a learning rate) into shape (1,)
    return array if array.flags.c_contiguous else np.array(array, order="C")
