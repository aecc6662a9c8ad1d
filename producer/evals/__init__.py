"""Evals from the producer's side: submit a spec, follow it, stop and resume it, read its results."""

__all__: list[str] = []
