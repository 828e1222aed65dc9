# syntax=docker/dockerfile:1
# Sluice gateway image.  Build:  docker build -t sluice:0.1.0 .
# Run:  docker run -p 8080:8080 -p 9901:9901 -v $PWD/my.yaml:/etc/sluice/sluice.yaml:ro sluice:0.1.0
# The config must listen on 0.0.0.0 (not the loopback default) to be reachable from outside.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: a wheel of Sluice, installed with its dependencies into a self-contained venv
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway/ gateway/
COPY scaler/ scaler/
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv --without-pip /opt/sluice \
 && python -m pip --python /opt/sluice/bin/python install /wheels/sluice-*.whl

# ---- runtime: the base image, the venv, a non-root user; no compilers, no build tools
FROM ${PYTHON_IMAGE} AS runtime
ARG SLUICE_UID=10001
ARG SLUICE_VERSION=0.1.0
LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="Ingress-aware traffic gateway with a built-in autoscaler" \
      org.opencontainers.image.version="${SLUICE_VERSION}"
RUN groupadd --system --gid ${SLUICE_UID} sluice \
 && useradd --system --uid ${SLUICE_UID} --gid sluice --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin sluice
COPY --from=build /opt/sluice /opt/sluice
COPY config/examples/container.yaml /etc/sluice/sluice.yaml
ENV PATH=/opt/sluice/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /tmp
USER ${SLUICE_UID}:${SLUICE_UID}
# data plane, admin plane (health, readiness, metrics, API)
EXPOSE 8080 9901
# liveness of the admin plane of the shipped config (a mounted config may move the port)
HEALTHCHECK --interval=30s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9901/healthz', timeout=2)"]
ENTRYPOINT ["sluice", "run", "--config", "/etc/sluice/sluice.yaml"]
