# The image of every ablate service (Prefect server, deployer, sweep/cpu/GPU workers). Build it on each machine
# (`docker compose build`) or push it to a registry the GPU machines can pull from.
#
# torch: the CUDA build from PyTorch's cu126 index by default, because it is the one that still runs on V100s.
# From PyTorch 2.11 on, the CUDA 12.8 and 13.x wheels (and so plain `pip install torch` from PyPI) carry no sm_70
# (Volta) kernels; the CUDA 12.6 wheels keep Maxwell/Pascal/Volta through 2.14 (sources: pytorch/pytorch#172352
# and PR #175253, RELEASE.md's support matrix; #190385 proposes removing cu126 in 2.15, outside ablate's torch
# range). An RTX 3060 (sm_86) runs the cu126 build too; a Blackwell GPU needs TORCH_INDEX=.../whl/cu128 or cu130.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN apt-get update && apt-get install -y --no-install-recommends postgresql-client && rm -rf /var/lib/apt/lists/*

# torch in its own layer: a code change does not download it again
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu126
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"

# then the dependencies (from pyproject.toml alone, with empty packages; the orchestrator, the CMA-ES sampler and the
# benchmark's HF Trainer as extras), then the code; bench/ runs from /app as `python -m bench`, not installed
WORKDIR /app
COPY pyproject.toml README.md ./
RUN mkdir -p ablate flows && touch ablate/__init__.py flows/__init__.py && pip install -e ".[prefect,cmaes,bench]"
COPY ablate ./ablate
COPY flows ./flows
COPY bench ./bench
COPY sweeps ./sweeps
RUN pip install --no-deps -e .

# installed-package plugins (entry-point group `ablate.plugins`) every worker must have, e.g.
# `EXTRA_REQUIREMENTS="ablate-shiftmix==0.1.0 git+https://host/lab/mixers@v2"`; plugin files need nothing here
# (their source travels in the results DB)
ARG EXTRA_REQUIREMENTS=""
RUN if [ -n "${EXTRA_REQUIREMENTS}" ]; then pip install ${EXTRA_REQUIREMENTS}; fi

# runs record the code version (runs.code_version): there is no .git here, so it is stamped at build time
ARG ABLATE_CODE_VERSION=unknown
ENV ABLATE_CODE_VERSION=${ABLATE_CODE_VERSION}
CMD ["ablate", "--help"]
