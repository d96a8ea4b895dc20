# syntax=docker/dockerfile:1
# dra-driver image: one console script, `dra-driver`, for every role (docs/image.md).
#   docker build -t <repo>/dra-driver:<tag> .
#   make image   (podman, no registry needed: scripts/build-image.sh)
# `python3`, not `python`: the same on python:3.11-slim and on a Debian base whose python3 is 3.11.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- builder: the project's wheel plus a wheel of every runtime dependency --------------------------
FROM ${PYTHON_IMAGE} AS builder
# The package index the dependencies come from (a local mirror: --build-arg PIP_INDEX_URL=...).
ARG PIP_INDEX_URL=https://pypi.org/simple
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY dra_driver ./dra_driver
RUN python3 -m pip wheel --wheel-dir /wheels .

# --- final: the wheels installed offline; no compiler, no sources, no wheel files left behind -------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="dra-driver" \
      org.opencontainers.image.description="Kubernetes DRA driver for NVIDIA GPUs (kubelet plugin)" \
      org.opencontainers.image.licenses="Apache-2.0"
# No .pyc writes at run time (pip compiled them at install): the chart mounts the root filesystem read-only.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The wheels are bind-mounted from the builder for this one step, so they never become an image layer.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python3 -m pip install --no-index --find-links=/wheels /wheels/dra_driver-*.whl \
 && python3 -m pip check \
 && groupadd --system --gid 65532 dra-driver \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin dra-driver
# Non-root by default: `dra-driver inventory --nvml fake:...` and the chart's driver-wait init container
# need nothing more. The chart's kubelet plugin container overrides it: uid 0 for the kubelet's
# root-owned socket directories (no capabilities at all with nvml: fake), and privileged with real
# GPUs, because NVML needs the /dev/nvidia* devices and MIG management needs CAP_SYS_ADMIN.
USER 65532:65532
ENTRYPOINT ["dra-driver"]
CMD ["--help"]
