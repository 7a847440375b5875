# GPU worker / head-node image: CUDA torch from PyPI, then ablate with its Prefect and DB stack.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN apt-get update && apt-get install -y --no-install-recommends git postgresql-client && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY ablate ./ablate
COPY flows ./flows
COPY bench ./bench
COPY sweeps ./sweeps
RUN pip install "torch>=2.3,<2.15" && pip install -e .
CMD ["ablate", "--help"]
