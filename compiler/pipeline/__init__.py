"""Pipeline parallelism: schedules generated and checked in one place (schedule.py, check.py)."""

from tessel.compiler.pipeline.check import Timing, check, simulate_schedule, skeleton
from tessel.compiler.pipeline.schedule import SCHEDULERS, Action, Message, Op, Schedule, generate

__all__ = [
    "SCHEDULERS",
    "Action",
    "Message",
    "Op",
    "Schedule",
    "Timing",
    "check",
    "generate",
    "simulate_schedule",
    "skeleton",
]
