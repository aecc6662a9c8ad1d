"""Wesichain's domain core: state, transitions, tools, policy, events and the Redis store.

Nothing here imports Celery, so all of it is pure and unit-testable.
"""

__all__: list[str] = []
