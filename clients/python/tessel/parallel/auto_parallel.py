"""MindSpore 2.6's `AutoParallel(network, parallel_mode)`: a cell that runs a network (or a training-step
function) in parallel, configured by its methods instead of `set_auto_parallel_context`.

    >>> with no_init_parameters():
    ...     net = Network()
    >>> parallel_net = AutoParallel(net, parallel_mode="semi_auto")
    >>> parallel_net.dataset_strategy("data_parallel")
    >>> model = ms.Model(parallel_net, loss_fn, optimizer)

It is the same machinery as the older context API: constructing it (and each configuration method) sets the
job's auto-parallel context — parallel_mode SEMI_AUTO_PARALLEL ("semi_auto") or AUTO_PARALLEL with that search
mode, MindSpore's AutoParallel defaults (gradients_mean False) — so everything the job compiles afterwards,
inside the wrapper or not (an optimizer called on its gradients), is planned alike. Calling it compiles the
wrapped network or function as one graph (MindSpore's `@jit construct`).
"""

from __future__ import annotations

from typing import Any

from tessel import context
from tessel.common.compiled import CompiledFunction, arg_names_of
from tessel.common.support import not_supported_yet
from tessel.nn.cell import Cell

_MODES = {
    "semi_auto": (context.ParallelMode.SEMI_AUTO_PARALLEL, None),
    "sharding_propagation": (context.ParallelMode.AUTO_PARALLEL, "sharding_propagation"),
    "recursive_programming": (context.ParallelMode.AUTO_PARALLEL, "recursive_programming"),
}


class AutoParallel(Cell):
    """`AutoParallel(network, parallel_mode="semi_auto")`: see the module docstring."""

    def __init__(self, network: Any, parallel_mode: str = "semi_auto"):
        super().__init__(auto_prefix=False)
        if parallel_mode not in _MODES:
            raise ValueError(
                f"the argument 'parallel_mode' must be one of {list(_MODES)}, but got the value : {parallel_mode} ."
            )
        if not callable(network):
            raise TypeError(f"AutoParallel wraps a Cell or a function, got {type(network).__name__}")
        self.network = network
        self._parallel_mode = parallel_mode
        self._dataset_strategy_config: Any = "data_parallel"
        self._gradients_mean = False
        self._comm_fusion_config: dict = {}
        self._pipeline_stages = 1
        self._pipeline_broadcast = False
        self._pipeline_config: dict[str, Any] = {"pipeline_interleave": False, "pipeline_scheduler": "1f1b"}
        self._strategy_files: dict[str, Any] = {}
        self._optimizer_parallel: dict[str, Any] | None = None  # hsdp()'s parallel_optimizer_config
        self._sync_options: dict[str, bool] = {}  # gradient_fp32_sync / loss_repeated_mean when disabled
        function = network.construct if isinstance(network, Cell) else network
        object.__setattr__(
            self,
            "_whole",
            CompiledFunction(self._run, f"AutoParallel_{_name(network)}", arg_names=arg_names_of(function)),
        )
        self._apply()

    # --- configuration ------------------------------------------------------------------------------------------
    def _apply(self) -> None:
        mode, search = _MODES[self._parallel_mode]
        settings: dict[str, Any] = {
            "parallel_mode": mode,
            "dataset_strategy": self._dataset_strategy_config,
            "gradients_mean": self._gradients_mean,
        }
        if search is not None:
            settings["search_mode"] = search
        if self._strategy_files:
            settings["strategy_ckpt_config"] = dict(self._strategy_files)
        settings["pipeline_stages"] = self._pipeline_stages
        settings["pipeline_config"] = dict(self._pipeline_config)
        settings["pipeline_result_broadcast"] = self._pipeline_broadcast
        # Every setting this wrapper owns is written, set or not: a second AutoParallel (an eval network) must not
        # run with the first one's optimizer sharding or sync options.
        settings["enable_parallel_optimizer"] = self._optimizer_parallel is not None
        if self._optimizer_parallel is not None:
            settings["parallel_optimizer_config"] = dict(self._optimizer_parallel)
        settings["gradient_fp32_sync"] = self._sync_options.get("gradient_fp32_sync", True)
        settings["loss_repeated_mean"] = self._sync_options.get("loss_repeated_mean", True)
        settings["force_fp32_communication"] = getattr(self, "_fp32_communication", False)
        context.set_auto_parallel_context(**settings)

    def dataset_strategy(self, config: Any) -> None:
        """How each rank's dataset batch tiles the global batch: "data_parallel" (dim 0 split over the ranks, the
        default), "full_batch" (every rank the whole batch) or one tuple of cuts (or one Layout) per column."""
        if config is None:
            raise ValueError("dataset_strategy is none in config!")
        if isinstance(config, str):
            if config not in ("full_batch", "data_parallel"):
                raise ValueError(
                    "For 'AutoParallel.dataset_strategy', the argument 'config' must be 'full_batch' or "
                    f"'data_parallel', but got the value : {config}."
                )
        elif not isinstance(config, tuple):
            raise TypeError(
                "For 'AutoParallel.dataset_strategy', the argument 'config' must be str or tuple type, but got the "
                f"type : {type(config)}."
            )
        self._dataset_strategy_config = config
        self._apply()

    def enable_gradients_mean(self) -> None:
        """Average (instead of sum) gradients over data-parallel copies where the framework reduces them."""
        self._gradients_mean = True
        self._apply()

    def comm_fusion(self, config: dict) -> None:
        """Fusion of the gradients' collectives, as set_auto_parallel_context(comm_fusion=config):
        {"allreduce": {"mode": "size", "config": MB}} sets the bucket size; "openstate" True (the default) is
        accepted, False and the other keys are not supported yet."""
        if config is not None and not isinstance(config, dict):
            raise TypeError(f"The parameter '{config}' must be {dict}, but got {type(config)}.")
        unknown = sorted(set(config or {}) - {"allreduce", "openstate"})
        if unknown:
            raise not_supported_yet(f"AutoParallel.comm_fusion {unknown}", "only gradient all-reduce buckets are fused")
        if config:  # the context checks every key it is given (openstate=False is refused there)
            context.set_auto_parallel_context(comm_fusion=dict(config))
        self._comm_fusion_config = dict(config or {})

    def get_pipeline_stages(self) -> int:
        return self._pipeline_stages

    def pipeline(self, stages: int = 1, output_broadcast: bool = False, interleave: bool = False, scheduler="1f1b"):
        """Pipeline parallel over `stages` stages (the cells' pipeline_stage say which runs where), as
        set_auto_parallel_context(pipeline_stages=stages, pipeline_config={"pipeline_interleave": interleave,
        "pipeline_scheduler": scheduler}) does: see tessel.parallel.pipeline. Every stage returns the step's
        results (the last stage sends them to the others), whatever `output_broadcast` says.

            >>> parallel_net = AutoParallel(train_one_step, parallel_mode="semi_auto")
            >>> parallel_net.pipeline(stages=2, scheduler="zero_bubble_h1")
        """
        if isinstance(stages, bool) or not isinstance(stages, int):
            raise TypeError(
                f"For 'AutoParallel.pipeline', the argument 'stages' must be int type, but got the type : "
                f"{type(stages)}."
            )
        if stages <= 0:
            raise ValueError(
                f"For 'AutoParallel.pipeline', the argument 'stages' must be larger than zero, but got value: {stages}."
            )
        for name, value in (("output_broadcast", output_broadcast), ("interleave", interleave)):
            if not isinstance(value, bool):
                raise TypeError(
                    f"For 'AutoParallel.pipeline', the argument '{name}' must be bool type, but got the type : "
                    f"{type(value)}."
                )
        if not isinstance(scheduler, str):
            raise TypeError(
                f"For 'AutoParallel.pipeline', the argument 'scheduler' must be str type, but got the type : "
                f"{type(scheduler)}."
            )
        config = {"pipeline_interleave": interleave, "pipeline_scheduler": scheduler}
        context.set_auto_parallel_context(pipeline_stages=stages, pipeline_config=config)  # validates, says why not
        self._pipeline_stages, self._pipeline_config = stages, config
        self._pipeline_broadcast = output_broadcast  # pipeline_result_broadcast: every stage gets the result anyway
        self._apply()

    def hsdp(self, shard_size: int = -1, threshold: int = 64, optimizer_level: str = "level1") -> None:
        """Optimizer parallel (MindSpore's hsdp): each parameter replicated over some ranks has dim 0 cut over them
        (over runs of `shard_size` of them; -1: all), each rank holding the optimizer state of its block and updating
        only it ("level1"), also keeping only its block of the gradient ("level2"), or also storing only its block
        of the weight, gathered before each use ("level3"). Parameters under `threshold` KB stay whole."""
        if isinstance(shard_size, bool) or not isinstance(shard_size, int) or (shard_size <= 0 and shard_size != -1):
            raise ValueError(f"shard_size must be a positive integer or -1, but got {shard_size}.")
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
            raise ValueError(f"threshold must be a positive integer or 0, but got {threshold}.")
        if optimizer_level not in ("level1", "level2", "level3"):
            raise ValueError(f"Optimizer level should in ['level1', 'level2', 'level3'], but got {optimizer_level}")
        self._optimizer_parallel = {
            "optimizer_weight_shard_size": shard_size,
            "parallel_optimizer_threshold": threshold,
            "optimizer_level": optimizer_level,
        }
        self._apply()

    def no_init_parameters_in_compile(self) -> None:
        raise not_supported_yet(
            "AutoParallel.no_init_parameters_in_compile",
            "parameters created under no_init_parameters are materialised (each rank its slice) when first compiled",
        )

    def load_param_strategy_file(self, file_path: str) -> None:
        """Lay the parameters out, and plan the graphs, as the strategy file says (strategy_ckpt_config's
        load_file)."""
        self._strategy_files["load_file"] = _path(file_path, "load_param_strategy_file")
        self._apply()

    def save_param_strategy_file(self, file_path: str) -> None:
        """Write every parameter's layout and every planned graph's op strategies to `file_path` (JSON)."""
        self._strategy_files["save_file"] = _path(file_path, "save_param_strategy_file")
        self._apply()

    def disable_strategy_file_only_for_trainable_params(self) -> None:
        """Strategy files list the layouts of every parameter, not only the trainable ones."""
        self._strategy_files["only_trainable_params"] = False
        self._apply()

    def save_operator_strategy_file(self, file_path: str) -> None:
        raise not_supported_yet("AutoParallel.save_operator_strategy_file", "strategy files come with the planner")

    def load_operator_strategy_file(self, file_path: str) -> None:
        raise not_supported_yet("AutoParallel.load_operator_strategy_file", "strategy files come with the planner")

    def enable_fp32_communication(self) -> None:
        """Reduce in float32: every AllReduce and ReduceScatter of float16 values is cast to float32 before and
        back after (force_fp32_communication); a float32 network's reductions are float32 already."""
        self._fp32_communication = True
        self._apply()

    def disable_gradient_fp32_sync(self) -> None:
        """All-reduce float16 gradients in float16 (by default they are cast to float32 for the reduction)."""
        self._sync_options["gradient_fp32_sync"] = False
        self._apply()

    def disable_loss_repeated_mean(self) -> None:
        """Do not divide the gradient of a loss that several ranks compute alike by their number."""
        self._sync_options["loss_repeated_mean"] = False
        self._apply()

    def set_group_ckpt_save_file(self, file_path: str) -> None:
        raise not_supported_yet("AutoParallel.set_group_ckpt_save_file", "communication groups are not checkpointed")

    def print_local_norm(self) -> None:
        raise not_supported_yet("AutoParallel.print_local_norm", "no per-rank norm dump")

    def dump_local_norm(self, file_path: str) -> None:
        raise not_supported_yet("AutoParallel.dump_local_norm", "no per-rank norm dump")

    def enable_device_local_norm(self) -> None:
        raise not_supported_yet("AutoParallel.enable_device_local_norm", "no per-rank norm dump")

    def transformer_opt(self, file_path: str) -> None:
        raise not_supported_yet("AutoParallel.transformer_opt", "an Ascend speed-up configuration")

    # --- running ------------------------------------------------------------------------------------------------
    def construct(self, *args: Any, **kwargs: Any) -> Any:
        return self.network(*args, **kwargs)

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        from tessel.common.tracing import current

        with current().in_cell(self):
            return self.network(*args, **kwargs)

    def _compiled_entry(self, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        from tessel.autograd import _GradFunction

        self._apply()
        if isinstance(self.network, _GradFunction):
            return self.network.compiled.entry(args, kwargs)
        return self._whole.entry(args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from tessel.autograd import _GradFunction
        from tessel.common.tracing import current

        if current() is not None:
            return super().__call__(*args, **kwargs)
        self._apply()  # the job's context is this wrapper's configuration
        if isinstance(self.network, _GradFunction):  # compiles itself, its gradients kept on the daemon
            return self.network(*args, **kwargs)
        return self._whole(*args, **kwargs)


def _name(network: Any) -> str:
    return getattr(network, "cls_name", None) or getattr(network, "__name__", "network")


def _path(file_path: Any, what: str) -> str:
    if not isinstance(file_path, str) or not file_path:
        raise TypeError(f"AutoParallel.{what}: file_path must be a non-empty str, got {file_path!r}")
    return file_path
