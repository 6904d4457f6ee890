# reprobisect with PyTorch (CPU). For CUDA, build FROM a pytorch/pytorch CUDA runtime image
# instead and drop the torch install line: the `torch` extra accepts any torch >= 2.1.
FROM python:3.11-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends git \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/reprobisect
COPY pyproject.toml README.md ./
COPY reprobisect ./reprobisect
COPY examples ./examples

RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install --no-cache-dir ".[torch]"

ENTRYPOINT ["bisect"]
CMD ["--help"]
