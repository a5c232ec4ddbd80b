"""The Ascend plugin: ONNX Runtime's CANN execution provider and HCCL.

Unavailable without an Ascend NPU and CANN; it says so at daemon start, never falling back to the CPU.
"""

from __future__ import annotations

import os

from tessel.core.plugin import Plugin


class AscendPlugin(Plugin):
    name = "ascend"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        try:
            import onnxruntime
        except ImportError:
            return False, "onnxruntime is not installed; install an onnxruntime build with the CANN provider"
        if "CANNExecutionProvider" not in onnxruntime.get_available_providers():
            return False, "onnxruntime has no CANNExecutionProvider; install the CANN toolkit and its onnxruntime"
        if not os.path.exists("/dev/davinci0"):
            return False, "no Ascend NPU found (/dev/davinci0 missing); run the ascend daemon on an Ascend host"
        return False, "the ascend plugin's HCCL collectives are not built yet; use --plugin cpu"

    def __init__(self, device_id: int = 0, threads: int = 1, host: str = "127.0.0.1", advertise_host: str = ""):
        raise RuntimeError(self.available()[1])

    device = compute = collective = property(lambda self: None)  # never constructed while unavailable
