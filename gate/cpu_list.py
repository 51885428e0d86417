"""CPU id lists in the syntax Linux, Docker and vLLM share: ``[0, 1, 2, 5]`` -> ``0-2,5``.

Standard library only: the engine worker (vLLM's per-rank binding) and the orchestrator (a
container's cpuset) both write them.
"""

from __future__ import annotations

from collections.abc import Iterable


def cpu_list(ids: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5`` (sorted, duplicates dropped); empty for no CPUs."""
    runs: list[list[int]] = []
    for cpu in sorted(set(ids)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
