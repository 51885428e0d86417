"""How the suite is split between pytest-xdist's two workers (``-n 2 --dist loadgroup``).

An engine test keeps about 1.3 of a 2-core runner's cores busy (engine start-up, tokenisation and
the gate's own Python are single-threaded), so two streams of tests finish the suite sooner than
one. What a test shares decides where it may run:

- a fixture wider than a function that a test file defines itself (a Docker image, a module's
  replay) is built once per worker that asks for it, so the file's tests go to one worker, as one
  unit (an ``xdist_group`` named after the file);
- a session fixture of a conftest that is too costly to build twice (``SHARED_GROUPS``) pulls every
  file that uses it into one group;
- every other test is a unit of its own: the cheap shared replays (the default run, the raw-mode
  run) are built at most once per worker.

Units are handed out in the order of ``items``, and a worker takes the next one when it is nearly
idle, so the longest files go first (``LONGEST_FIRST``, from CI's ``--durations`` report) and the
many short unit tests fill the end, where they keep both workers busy until the last test.
"""

from __future__ import annotations

import pytest

# Conftest session fixtures that cost minutes: each file that uses one runs in that fixture's group.
SHARED_GROUPS = {"noisy_control": "noise-controls"}  # 20 seeds of a noisy A/A pair

# Test files by their running time in CI, longest first; any other file follows in collection order.
LONGEST_FIRST = (
    "tests/integration/test_init_then_run.py",
    "tests/integration/test_tied_head.py",
    "tests/integration/test_noise_and_meaning.py",
    "tests/integration/test_faults.py",
    "tests/integration/test_docker.py",
    "tests/integration/test_server_mode.py",
    "tests/integration/test_tensor_parallel.py",
    "tests/integration/test_weight_sync.py",
    "tests/integration/test_verdicts.py",
    "tests/integration/test_inflight.py",
)
_UNIT_TESTS = "tests/unit/"


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _fixtures_wider_than_a_test(item: pytest.Item) -> list[tuple[str, str]]:
    """(name, where defined) of each fixture the test uses whose scope is wider than a function."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [(name, definition.baseid) for name, definitions in info.name2fixturedefs.items()
            for definition in definitions[-1:] if definition.scope != "function"]  # fmt: skip


def groups(items: list[pytest.Item]) -> dict[str, str]:
    """The xdist group of each file whose tests must share one worker (file -> group name)."""
    by_file: dict[str, str] = {}
    for item in items:
        for name, where in _fixtures_wider_than_a_test(item):
            if name in SHARED_GROUPS:
                by_file[_file(item)] = SHARED_GROUPS[name]
            elif where == _file(item):
                by_file.setdefault(_file(item), _file(item))
    return by_file


def _rank(item: pytest.Item) -> int:
    file = _file(item)
    if file in LONGEST_FIRST:
        return LONGEST_FIRST.index(file)
    return len(LONGEST_FIRST) + (1 if file.startswith(_UNIT_TESTS) else 0)


def schedule(items: list[pytest.Item]) -> None:
    """Mark each grouped file's tests with its ``xdist_group`` and put the longest files first (a
    stable sort: within a file, and among the files of one rank, collection order is kept)."""
    by_file = groups(items)
    for item in items:
        if group := by_file.get(_file(item)):
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=_rank)
