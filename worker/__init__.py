"""The Celery side: one task per phase of the run state machine, plus the recovery sweeper."""

__all__: list[str] = []
