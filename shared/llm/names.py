"""How a model string reads: ``PROVIDER:MODEL``, optionally ``react+PROVIDER:MODEL``.

One reading for every place that interprets one: the providers building an adapter for it, and
a tenant's allowed models checked before a run may name it (``shared/tenants.py``), so the model
a check allowed is the model a worker calls.
"""

from __future__ import annotations

from shared.errors import ConfigError

__all__ = ["REACT_PREFIX", "split_model_string"]

REACT_PREFIX = "react+"


def split_model_string(model_string: str) -> tuple[bool, str, str]:
    """``react+ollama:llama3`` -> (True, "ollama", "llama3"). Model names may contain colons
    (``ollama:llama3:8b``); only the first one separates the provider."""
    text = model_string.strip()
    react = text.startswith(REACT_PREFIX)
    provider, sep, model = text.removeprefix(REACT_PREFIX).partition(":")
    if not sep or not provider or not model:
        raise ConfigError(
            f"model string {model_string!r} must look like PROVIDER:MODEL (optionally prefixed with "
            f"{REACT_PREFIX!r}), e.g. 'openai:gpt-4o-mini'"
        )
    return react, provider.strip().lower(), model.strip()
