"""Batch evaluation of agents on the worker pool: specs, datasets, scorers and the eval's Redis state.

Nothing here imports Celery: the pool's tasks (``worker/evals.py``) and the producer's commands
(``producer/evals/``) both build on these modules.
"""

__all__: list[str] = []
