"""Pipelines of runs: agent runs chained, fanned out and merged across the pool.

A pipeline is defined in Python in the agents module (``Pipeline``, ``definition.py``), checked when
registered (``check.py``), and run as a state machine in Redis (``store.py``) driven by the pool's
tasks (``worker/pipelines.py``); producers submit and follow it (``producer/pipelines.py``).
"""

from shared.pipeline.definition import Pipeline

__all__ = ["Pipeline"]
