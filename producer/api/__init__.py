"""The HTTP API (``wesichain api``): other services start, follow and steer runs with an API key.

Stateless: every request reads and writes the run state in Redis, so any number of API processes
can serve behind a load balancer. See ``docs/api.md``.
"""

__all__: list[str] = []
