FROM python:3.11-slim
RUN useradd --create-home wesichain
WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared shared
COPY worker worker
COPY producer producer
COPY api api
RUN pip install --no-cache-dir ".[postgres]"
# Your agents' own dependencies, e.g. --build-arg PIP_EXTRA="mylib>=2 otherlib" (docker-compose.yml).
ARG PIP_EXTRA=""
RUN if [ -n "$PIP_EXTRA" ]; then pip install --no-cache-dir $PIP_EXTRA; fi
USER wesichain
ENTRYPOINT ["wesichain"]
