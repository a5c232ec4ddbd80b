"""Pipeline parallelism: schedules generated and checked in one place (schedule.py, check.py), the pass that cuts a
rank's graph into its stage in schedule order (stages.py, split.py), and what the lowering needs from it
(registry.py)."""

from tessel.compiler.pipeline.check import Timing, check, simulate_schedule, skeleton
from tessel.compiler.pipeline.registry import actions_of, check_lowered, phases_of
from tessel.compiler.pipeline.schedule import SCHEDULERS, Action, Link, Message, Op, Schedule, Transfers, generate
from tessel.compiler.pipeline.split import PipelinedGraph, pipeline_rank_graph
from tessel.compiler.pipeline.stages import Tag

__all__ = [
    "SCHEDULERS",
    "Action",
    "Link",
    "Message",
    "Op",
    "PipelinedGraph",
    "Schedule",
    "Tag",
    "Timing",
    "Transfers",
    "actions_of",
    "check",
    "check_lowered",
    "generate",
    "phases_of",
    "pipeline_rank_graph",
    "simulate_schedule",
    "skeleton",
]
