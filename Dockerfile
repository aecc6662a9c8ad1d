# A fixed Python release: a rebuild gets the same interpreter (docs/operations.md, "Deployment").
FROM python:3.11.10-slim-bookworm
RUN useradd --create-home wesichain
WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared shared
COPY worker worker
COPY producer producer
# postgres: the archive profile's driver; mcp: tools from MCP servers (shared/mcp_tools.py);
# otel: WESICHAIN_OTEL=1. Each is imported only when used.
RUN pip install --no-cache-dir ".[postgres,mcp,otel]"
# Your agents' own dependencies, e.g. --build-arg PIP_EXTRA="mylib>=2 otherlib" (docker-compose.yml).
ARG PIP_EXTRA=""
RUN if [ -n "$PIP_EXTRA" ]; then pip install --no-cache-dir $PIP_EXTRA; fi
USER wesichain
ENTRYPOINT ["wesichain"]
