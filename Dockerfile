FROM python:3.11-slim
RUN useradd --create-home wesichain
WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared shared
COPY worker worker
COPY producer producer
RUN pip install --no-cache-dir .
USER wesichain
ENTRYPOINT ["wesichain"]
