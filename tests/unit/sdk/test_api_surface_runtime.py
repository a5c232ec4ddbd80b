"""tessel.runtime against mindspore.runtime (2.7): the same argument checks and once-per-process rules, the memory
queries MindSpore's CPU backend answers (values measured with MindSpore 2.7.0 on CPU), and a log line or a
NotSupportedYetError for what has no effect here."""

from __future__ import annotations

import logging

import pytest

from tessel import runtime
from tessel.core.errors import NotSupportedYetError

GB = 1024**3


@pytest.fixture(autouse=True)
def fresh_runtime(monkeypatch):
    """Each test starts as a fresh process would: nothing configured, nothing logged yet."""
    from tessel.core import options as support

    monkeypatch.setattr(runtime, "_configured", set())
    monkeypatch.setattr(runtime, "_memory", runtime.MemorySettings())
    monkeypatch.setattr(support, "_logged", set())


def on_target(monkeypatch, target: str) -> None:
    """device_target as set_context would set it, without the plugin choice set_context also makes."""
    from tessel import context

    monkeypatch.setitem(context._context, "device_target", target)


def test_runtime_resolves_from_the_top_level_package():
    import subprocess
    import sys

    code = "import tessel as ms; ms.runtime.set_memory(max_size='28GB'); print(ms.runtime.memory_settings().max_size)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(28 * GB)


def test_set_memory_records_sizes_and_logs_once(caplog):
    assert runtime.memory_settings() == runtime.MemorySettings()  # MindSpore's defaults until set
    assert runtime.memory_settings().max_size == 1024 * GB and not runtime.memory_settings().configured
    with caplog.at_level(logging.INFO, logger="tessel"):
        runtime.set_memory(init_size="1.5GB", increase_size="2GB", max_size="28GB", optimize_level="O1")
    settings = runtime.memory_settings()
    assert (settings.init_size, settings.increase_size, settings.max_size) == (int(1.5 * GB), 2 * GB, 28 * GB)
    assert settings.optimize_level == "O1" and settings.huge_page_reserve_size == 0 and settings.configured
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "memory_settings()" in caplog.text and "28GB" in caplog.text


def test_set_memory_twice_is_a_runtime_error_as_mindspore():
    runtime.set_memory(max_size="28GB")
    with pytest.raises(RuntimeError, match="can not be set repeatedly"):
        runtime.set_memory(max_size="28GB")
    assert runtime.memory_settings().max_size == 28 * GB


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"init_size": "0GB"}, ValueError, "not 0"),
        ({"max_size": "28gb"}, ValueError, "size in GB"),
        ({"max_size": "28"}, ValueError, "size in GB"),
        ({"max_size": "28GBs"}, ValueError, "not a number"),
        ({"huge_page_reserve_size": "x"}, ValueError, "size in GB"),
        ({"optimize_level": "O2"}, ValueError, "O0"),
        ({"init_size": 2}, TypeError, "must be str"),
    ],
)
def test_set_memory_validates_like_mindspore(kwargs, error, match):
    with pytest.raises(error, match=match):
        runtime.set_memory(**kwargs)
    runtime.set_memory(huge_page_reserve_size="0GB")  # a rejected call does not count as the one call
    assert runtime.memory_settings().configured


def test_set_memory_on_an_accelerator_target_warns(caplog, monkeypatch):
    on_target(monkeypatch, "GPU")
    with caplog.at_level(logging.INFO, logger="tessel"):
        runtime.set_memory(max_size="28GB")
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


def test_memory_queries_on_cpu_are_mindspores_zeros():
    stats = runtime.memory_stats()
    assert stats["total_reserved_memory"] == stats["max_allocated_memory"] == 0
    assert stats["commom_mem_pool_stats"] == {"block_unit_size": 0, "block_counts": 0, "blocks_info": {}}
    for query in (
        runtime.memory_reserved,
        runtime.max_memory_reserved,
        runtime.memory_allocated,
        runtime.max_memory_allocated,
    ):
        assert query() == 0
    summary = runtime.memory_summary()
    assert summary.startswith("|=============================================|\n|               Memory summary")
    assert "| Reserved memory      |      0 B             |" in summary
    for reset in (
        runtime.reset_peak_memory_stats,
        runtime.reset_max_memory_reserved,
        runtime.reset_max_memory_allocated,
    ):
        assert reset() is None


def test_memory_queries_for_an_accelerator_target_are_not_supported_yet(monkeypatch):
    on_target(monkeypatch, "Ascend")
    with pytest.raises(NotSupportedYetError, match=r"not supported yet: mindspore\.runtime\.memory_allocated"):
        runtime.memory_allocated()
    with pytest.raises(NotSupportedYetError, match="memory_replay"):
        runtime.memory_replay("memory_block.csv")


def test_dispatch_threads_num_checks_and_once(caplog):
    with pytest.raises(TypeError):
        runtime.dispatch_threads_num(2.0)
    with pytest.raises(ValueError, match="> 0"):
        runtime.dispatch_threads_num(0)
    with caplog.at_level(logging.INFO, logger="tessel"):
        runtime.dispatch_threads_num(4)
    assert "TESSEL_THREADS" in caplog.text
    with pytest.raises(RuntimeError, match="repeatedly"):
        runtime.dispatch_threads_num(4)


def test_set_kernel_launch_group_and_capture_rules():
    with pytest.raises(ValueError, match="divisible"):
        runtime.set_kernel_launch_group(3, 8)
    with pytest.raises(ValueError, match="at least 1"):
        runtime.set_kernel_launch_group(0, 8)
    with pytest.raises(TypeError):
        runtime.set_kernel_launch_group("2", 8)
    runtime.set_kernel_launch_capture(True)
    with pytest.raises(RuntimeError, match="together"):
        runtime.set_kernel_launch_group(2, 8)
    runtime.set_kernel_launch_capture(False)
    runtime.set_kernel_launch_group(2, 8)
    with pytest.raises(RuntimeError, match="repeatedly"):
        runtime.set_kernel_launch_group(2, 8)
    with pytest.raises(RuntimeError, match="together"):
        runtime.set_kernel_launch_capture(True)
    with pytest.raises(TypeError):
        runtime.set_kernel_launch_capture(1)


def test_set_cpu_affinity_validates_then_warns_once(caplog):
    with pytest.raises(TypeError):
        runtime.set_cpu_affinity("yes")
    with pytest.raises(TypeError):
        runtime.set_cpu_affinity(True, "0-3")
    with pytest.raises(ValueError, match="cpuidX-cpuidY"):
        runtime.set_cpu_affinity(True, ["0:3"])
    with pytest.raises(ValueError, match="CPU indices"):
        runtime.set_cpu_affinity(True, ["0-3"], {"main": [-1]})
    # A per-device dict without this device's entry is ignored, as MindSpore does (device_id 0 -> "device0").
    runtime.set_cpu_affinity(True, {"device7": ["0-3"]})
    with caplog.at_level(logging.INFO, logger="tessel"):
        runtime.set_cpu_affinity(True, {"device0": ["0-3"]}, {"main": [0, 1]})
    assert [r.levelno for r in caplog.records] == [logging.WARNING] and "taskset" in caplog.text
    with pytest.raises(RuntimeError, match="repeatedly"):
        runtime.set_cpu_affinity(False)


def test_launch_blocking_synchronize_and_empty_cache_are_accepted(caplog):
    with caplog.at_level(logging.INFO, logger="tessel"):
        runtime.launch_blocking()
        runtime.launch_blocking()
        runtime.empty_cache()
    assert caplog.text.count("launch_blocking") == 1 and "empty_cache" in caplog.text
    assert runtime.synchronize() is None


@pytest.mark.parametrize("name", ["current_stream", "default_stream", "communication_stream", "set_cur_stream"])
def test_stream_functions_are_not_supported_yet(name):
    with pytest.raises(NotSupportedYetError, match=f"mindspore.runtime.{name}"):
        getattr(runtime, name)()


@pytest.mark.parametrize("cls", [runtime.Stream, runtime.StreamCtx, runtime.Event])
def test_stream_classes_are_not_supported_yet(cls):
    with pytest.raises(NotSupportedYetError, match=cls.__name__):
        cls()


def test_every_name_of_mindspore_runtime_exists():
    mindspore_27 = """
        Event Stream StreamCtx communication_stream current_stream default_stream dispatch_threads_num empty_cache
        launch_blocking max_memory_allocated max_memory_reserved memory_allocated memory_replay memory_reserved
        memory_stats memory_summary reset_max_memory_allocated reset_max_memory_reserved reset_peak_memory_stats
        set_cpu_affinity set_cur_stream set_kernel_launch_capture set_kernel_launch_group set_memory synchronize
    """.split()  # noqa: SIM905
    assert [name for name in mindspore_27 if not hasattr(runtime, name)] == []
    assert set(mindspore_27) <= set(runtime.__all__)


def test_set_context_options_without_effect_are_logged_once(caplog):
    import tessel as ms

    with caplog.at_level(logging.INFO, logger="tessel"):
        ms.set_context(max_device_memory="28GB")
        ms.set_context(max_device_memory="20GB", pynative_synchronize=True)
    assert caplog.text.count("set_context(max_device_memory='28GB'): no effect on CPU") == 1
    assert "pynative_synchronize" in caplog.text
    assert ms.get_context("max_device_memory") == "20GB"
