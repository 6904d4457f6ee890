# syntax=docker/dockerfile:1
#
# reprobisect for cluster nodes: ONE image for the head, every worker and the controller, so
# that a probe's result depends on the commit, not on the node that ran it (docs/cluster.md).
#
#   docker build -t reprobisect:cu128 .                     # torch for CUDA 12.8 (the default)
#   docker build -t reprobisect:cu126 --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 .
#   docker build -t reprobisect:cpu   --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu .
#   docker build --build-arg TORCH_VERSION=2.13.0 --build-arg RAY_VERSION=2.60.0 ...   # match the controller
#
# The CUDA torch wheels bring their own CUDA runtime, cuDNN and NCCL as pip packages, so the
# base needs no CUDA toolkit: a GPU node needs the NVIDIA driver and the container toolkit
# (`docker run --gpus all`, or the NVIDIA device plugin on Kubernetes) and nothing else.
# Ray must be the SAME version on the controller and on every node (RAY_VERSION); so must
# Python (PYTHON_VERSION).

ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

# Which torch build: the wheel index (cuXYZ or cpu) and the version (empty: the newest there).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ARG TORCH_VERSION=2.13.0
ARG RAY_VERSION=2.60.0
# The user probes run as (not root); uid 1000 matches the rayproject/ray images and most volumes.
ARG USER_NAME=ray
ARG USER_UID=1000

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# git: the controller archives commits (workers need none, but one image serves both);
# g++: reprobisect's native fingerprint kernel (reprobisect/native/fpstats.cpp) is compiled on
#   first use for the node's own CPU (-march=native) and cached in ~/.cache/reprobisect, so it
#   is built on each node, never here (a build here would target the build machine's CPU);
# tini: PID 1 that reaps the probes' process trees (torchrun agents, DataLoader workers);
# wget: KubeRay's readiness/liveness probes call it; openssh-client + rsync: `ray up`'s
#   autoscaler on the head reaches the workers with them; procps: ps/kill for `ray stop`.
# (Debian's point releases replace package versions: pins would break rebuilds; the base tag pins Debian)
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        git g++ tini wget openssh-client rsync procps ca-certificates \
 && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid "${USER_UID}" --shell /bin/bash "${USER_NAME}" \
 && python -m venv /opt/venv \
 && install -d -o "${USER_UID}" -g "${USER_UID}" /opt/reprobisect \
 && chown -R "${USER_UID}:${USER_UID}" /opt/venv

USER ${USER_NAME}
WORKDIR /home/${USER_NAME}

# torch first, from the chosen index; the `torch` extra below then accepts it as it is.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch${TORCH_VERSION:+==${TORCH_VERSION}}"

COPY --chown=${USER_UID}:${USER_UID} pyproject.toml README.md /opt/reprobisect/
COPY --chown=${USER_UID}:${USER_UID} reprobisect /opt/reprobisect/reprobisect
COPY --chown=${USER_UID}:${USER_UID} examples /opt/reprobisect/examples
RUN pip install "/opt/reprobisect[torch]" "ray[default]==${RAY_VERSION}" \
 && python -c "import torch, ray, reprobisect; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'ray', ray.__version__)" \
 && bisect --version

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["bisect", "--help"]
