# reprobisect with PyTorch. The torch build (CPU or CUDA) is chosen by TORCH_PIP_ARGS;
# the `torch` extra accepts any torch >= 2.1 and will not replace it.
FROM python:3.11-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends git \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/reprobisect
COPY pyproject.toml README.md ./
COPY reprobisect ./reprobisect
COPY examples ./examples

# Pick the torch build at build time, e.g. --build-arg TORCH_PIP_ARGS="torch==2.13.0 --index-url <your CPU or CUDA index>"
ARG TORCH_PIP_ARGS="torch"
RUN pip install --no-cache-dir $TORCH_PIP_ARGS \
 && pip install --no-cache-dir ".[torch]"

ENTRYPOINT ["bisect"]
CMD ["--help"]
