"""Benchmarks: the price of durability, against the Celery floor and against LangGraph.

Run everything with ``python -m benchmarks.run`` (``--quick`` for a smoke run); see README.md.
"""
