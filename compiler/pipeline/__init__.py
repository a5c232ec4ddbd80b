"""Pipeline parallelism: schedules generated and checked in one place (schedule.py, check.py)."""

from tessel.compiler.pipeline.check import Timing, check, simulate_schedule, skeleton
from tessel.compiler.pipeline.schedule import SCHEDULERS, Action, Link, Message, Op, Schedule, Transfers, generate

__all__ = [
    "SCHEDULERS",
    "Action",
    "Link",
    "Message",
    "Op",
    "Schedule",
    "Timing",
    "Transfers",
    "check",
    "generate",
    "simulate_schedule",
    "skeleton",
]
