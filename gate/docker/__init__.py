"""The Docker side of gate (host only; needs the ``docker`` extra).

- ``client``: connecting to the daemon, with clear errors.
- ``image``: the gate image (root ``Dockerfile``): its tag, build context, build and labels.
- ``mounts``: which host paths a container needs, mounted at the same absolute paths.
- ``container``: one container's settings (GPUs, IPC, user, caches; no capabilities, no privilege
  gain, a pids limit) and its life cycle: log
  streaming, timeout, OOM detection and removal on success, failure and Ctrl-C.
- ``bundle``: a whole gate command run inside the gate image (both engines in one container).

Per-engine containers from the user's own images are a runner: :mod:`gate.runners.docker`.
"""
