"""The GPU plugin: ONNX Runtime's CUDA execution provider and NCCL.

Unavailable without an NVIDIA GPU, CUDA and `tessel[gpu]`; it says so at daemon start and never falls back
to the CPU silently (onnxruntime-gpu would: its provider list is checked).
"""

from __future__ import annotations

import shutil

from tessel.core.plugin import Plugin


class GpuPlugin(Plugin):
    name = "gpu"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        try:
            import onnxruntime
        except ImportError:
            return False, "onnxruntime is not installed; pip install 'tessel[gpu]'"
        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            return False, (
                "onnxruntime has no CUDAExecutionProvider (installed build: "
                f"{onnxruntime.get_available_providers()}); pip install 'tessel[gpu]' on a machine with CUDA"
            )
        if shutil.which("nvidia-smi") is None:
            return False, "no NVIDIA driver found (nvidia-smi missing); run the gpu daemon on a GPU host"
        return False, "the gpu plugin's NCCL collectives are not built yet; use --plugin cpu"

    def __init__(self, device_id: int = 0, threads: int = 1, host: str = "127.0.0.1", advertise_host: str = ""):
        raise RuntimeError(self.available()[1])

    device = compute = collective = property(lambda self: None)  # never constructed while unavailable
