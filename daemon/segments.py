"""Compiled ONNX segments on a session. State inputs (parameters, optimizer slots) are double-buffered:
one binding reads buffer A and writes the model's "<name>/new" output into B, the next does the reverse, so
updates land in place with no copies, and the session's store always names the current buffer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tessel.core.errors import ConfigurationError

NEW = "/new"


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
        self._parity = 1 - self._parity
        for name in self.updated:
            tensors[name] = self._buffers[name][self._parity]
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
            if buffers is not None and buffers[self._parity] is current:
                continue
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
                    binding.input(name, self._buffers[name][parity])
                    binding.output(name + NEW, self._buffers[name][1 - parity])
                else:
                    binding.input(name, _contiguous(tensors[name]))
            for name in outputs:
                binding.output(name, self._placed.get(name))
            self._bindings[key] = binding
        return self._bindings[key]


def _contiguous(array: np.ndarray) -> np.ndarray:
    # np.ascontiguousarray would turn a 0-d array (a learning rate) into shape (1,)
    return array if array.flags.c_contiguous else np.array(array, order="C")
