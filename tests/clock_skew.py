"""Makes a test worker's clock run ahead of (or behind) the others', like a host with a wrong clock.

Loaded with ``celery worker --include tests.clock_skew``; the offset in seconds comes from
``WESICHAIN_TEST_CLOCK_SKEW_S`` (negative: behind). It shifts ``time.time`` for the whole worker
process, its pool children included (they are forked after the import), which is what every piece
of Python code that reads the wall clock sees on a skewed host.
"""

from __future__ import annotations

import os
import time

_SKEW_S = float(os.environ.get("WESICHAIN_TEST_CLOCK_SKEW_S", "0"))
_real_time = time.time


def _skewed_time() -> float:
    return _real_time() + _SKEW_S


time.time = _skewed_time
