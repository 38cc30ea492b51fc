# syntax=docker/dockerfile:1
# The operator image: the `pko` distribution in a virtualenv on Python slim, run as non-root.
#
#   docker build -t pko:latest .        (or: buildah bud -t pko:latest .)
#
# Only the package sources are in the build context (see .dockerignore): no tests, no e2e or hack
# tooling, and never a Pulumi CLI stand-in. The operator itself runs no Pulumi CLI; stack operations
# run in workspace pods (agent image, agent/Dockerfile).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# The same path in both stages: console scripts carry the venv's interpreter in their shebang.
RUN python -m venv /opt/pko
WORKDIR /src
# The dependencies first, exactly as locked (hack/lock.sh): every package pinned and hash-checked, none
# resolved here, so two builds of one commit install the same packages.
COPY requirements.lock ./
RUN /opt/pko/bin/pip install --require-hashes --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY pko/ pko/
COPY api/ api/
COPY agent/ agent/
# Then the project itself, adding no dependency. A regular (non-editable) install: the runtime stage
# needs nothing from /src.
RUN /opt/pko/bin/pip install --no-deps . \
 && /opt/pko/bin/pip check \
 && /opt/pko/bin/pip uninstall --yes pip setuptools wheel \
 && find /opt/pko -name '__pycache__' -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="pko" \
      org.opencontainers.image.description="Pulumi Kubernetes Operator (Python re-implementation): the operator" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/pko/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/pko /opt/pko
# Numeric user (65532, "nonroot" by convention) so that `runAsNonRoot: true` can be verified.
USER 65532:65532
WORKDIR /tmp
# The manager handles SIGTERM itself (drains workqueues, releases the Lease) and starts no
# child processes, so it runs as PID 1 without an init.
ENTRYPOINT ["pko"]
