# syntax=docker/dockerfile:1
# dra-driver image: one console script, `dra-driver`, for every role (docs/image.md).
#   docker build --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ) --build-arg SOURCE=<repository URL> -t <repo>/dra-driver:<tag> .
#   make image   (podman, no registry needed: scripts/build-image.sh passes all of them)
# `python3`, not `python`: the same on python:3.11-slim and on a Debian base whose python3 is 3.11.
# The base is pinned by digest (python:3.11-slim-bookworm's manifest list, so every architecture); refresh it with
# `docker buildx imagetools inspect python:3.11-slim-bookworm` (docs/image.md "Pins").
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

# --- builder: the locked dependencies as verified wheels, plus the project's own wheel -------------------------
FROM ${PYTHON_IMAGE} AS builder
# Marks this stage's image so `make image` can delete it after the build (it is untagged, and only a cache).
LABEL io.dra-driver.build-stage="builder"
# The package index the dependencies come from (a local mirror: --build-arg PIP_INDEX_URL=...).
ARG PIP_INDEX_URL=https://pypi.org/simple
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements/image.lock ./requirements/image.lock
# Wheels only, each checked against the lock's hashes: no sdist is built, so nothing unlocked runs at build time.
RUN python3 -m pip download --only-binary=:all: --require-hashes --no-deps -r requirements/image.lock -d /wheels
# The project's wheel, built by the locked build backend in a throw-away venv (no unlocked download for it either).
COPY requirements/build.lock ./requirements/build.lock
RUN python3 -m venv /build \
 && /build/bin/pip install --require-hashes --no-deps -r requirements/build.lock
COPY pyproject.toml README.md LICENSE ./
COPY dra_driver ./dra_driver
RUN /build/bin/pip wheel --no-build-isolation --no-deps --wheel-dir /wheels .

# --- final: the wheels installed offline, then pip and setuptools removed; no compiler, no sources ---------------
FROM ${PYTHON_IMAGE}
ARG PYTHON_IMAGE
ARG VERSION=unknown
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="dra-driver" \
      org.opencontainers.image.description="Kubernetes DRA driver for NVIDIA GPUs (kubelet plugin)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
# No .pyc writes at run time (pip compiled them at install): the chart mounts the root filesystem read-only.
# MALLOC_ARENA_MAX: glibc gives each thread that allocates an arena of its own, up to 8 per core; the kubelet plugin
# starts 64 gRPC workers at its first burst of claims, and their arenas kept 3.6 MiB more after 64-concurrent cycles
# with no CPU saved (docs/benchmarks.md, "Issue 37, item 2").
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MALLOC_ARENA_MAX=2
# The wheels and the lock are bind-mounted for this one step, so they never become an image layer. The dependencies
# are checked against the lock's hashes a second time (the wheels crossed a stage), the project wheel is installed
# without resolving anything. Then the installer goes: pip, setuptools and wheel are build tools, not runtime
# (python:3.11-slim's came from ensurepip and pip removes them; a Debian base's are dpkg packages).
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    --mount=type=bind,source=requirements/image.lock,target=/tmp/image.lock \
    python3 -m pip install --no-index --find-links=/wheels --require-hashes --no-deps -r /tmp/image.lock \
 && python3 -m pip install --no-index --no-deps /wheels/dra_driver-*.whl \
 && python3 -m pip check \
 && if dpkg-query -W -f='${Status}' python3-pip 2>/dev/null | grep -q 'install ok installed'; then \
      dpkg --purge python3-pip python3-setuptools python3-wheel python3-venv python3.11-venv \
        python3-pip-whl python3-setuptools-whl >/dev/null; \
    else \
      python3 -m pip uninstall -y -q pip setuptools wheel; \
    fi \
 && ! python3 -c 'import pip' 2>/dev/null \
 && ! python3 -c 'import setuptools' 2>/dev/null \
 && groupadd --system --gid 65532 dra-driver \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin dra-driver
# Non-root by default: `dra-driver inventory --nvml fake:...` needs nothing more. The chart's kubelet plugin
# container overrides it: uid 0 for the kubelet's root-owned socket directories (no capabilities at all with
# nvml: fake), and privileged with real GPUs, because NVML needs the /dev/nvidia* devices and MIG management
# needs CAP_SYS_ADMIN.
USER 65532:65532
ENTRYPOINT ["dra-driver"]
CMD ["--help"]
