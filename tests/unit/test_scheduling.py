"""How the suite shares a machine between xdist workers (tests/scheduling.py): each worker's CPUs,
groups that really keep their tests on one worker, and the order: the unit tests first (the fast
lane), then the longest files."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.scheduling import LONGEST_FIRST, worker_cpus

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("allowed", "worker", "workers", "share"), [
    ({0, 1}, 0, 2, {0}),
    ({0, 1}, 1, 2, {1}),
    (set(range(8)), 1, 3, {3, 4, 5}),  # 3, 3, 2: the remainder to the first workers
    (set(range(8)), 2, 3, {6, 7}),
    ({4, 9}, 1, 2, {9}),  # the CPUs given, not 0..n
    ({0}, 1, 2, {0}),  # fewer CPUs than workers: each takes them all
])  # fmt: skip
def test_each_worker_takes_its_own_contiguous_share(allowed, worker, workers, share):
    assert worker_cpus(allowed, worker, workers) == share


SUITE = """
import json, os
import pytest

@pytest.fixture(scope="module")
def built_once():
    return os.getpid()

def _record(name, built=None):
    with open(os.environ["RECORD"], "a") as f:
        f.write(json.dumps({"test": name, "worker": os.environ["PYTEST_XDIST_WORKER"], "built": built,
                            "cpus": sorted(os.sched_getaffinity(0))}) + "\\n")

@pytest.mark.parametrize("i", range(4))
def test_sharing_a_module_fixture(built_once, i):
    _record(f"shared{i}", built_once)

@pytest.mark.parametrize("i", range(4))
def test_on_its_own(i):
    _record(f"own{i}")

@pytest.mark.all_cpus
def test_needing_every_cpu():
    _record("all")
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's")
def test_a_group_stays_on_one_worker_and_each_worker_keeps_to_its_cpus(tmp_path):
    """Through xdist itself, with the suite's own hooks: the module fixture's tests run on one worker
    (xdist 3.8 ignored every group on pytest 9.2 until tests/scheduling.py wrote the test ids), each
    worker on its share of the CPUs, and an ``all_cpus`` test on all of them."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems, pytest_configure, pytest_runtest_protocol  # noqa: F401\n"
    )
    (tmp_path / "test_suite.py").write_text(textwrap.dedent(SUITE))
    record = tmp_path / "record.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RECORD": str(record)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-n", "2",
         "--dist", "loadgroup", "--no-loadscope-reorder", "--rootdir", str(tmp_path),
         "-o", "markers=all_cpus: test", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import json

    runs = [json.loads(line) for line in record.read_text().splitlines()]
    shared = [r for r in runs if r["test"].startswith("shared")]
    assert (
        len(shared) == 4
        and len({r["worker"] for r in shared}) == 1
        and len({r["built"] for r in shared}) == 1
    )
    given = sorted(os.sched_getaffinity(0))
    by_worker = {r["worker"]: r["cpus"] for r in runs if r["test"] != "all"}
    for worker, cpus in by_worker.items():
        index = int(worker.removeprefix("gw"))
        assert cpus == sorted(worker_cpus(set(given), index, 2)), (worker, cpus)
    assert next(r for r in runs if r["test"] == "all")["cpus"] == given


def _collected_order(root: Path) -> list[str]:
    """The test ids of the suite under ``root`` in the order the suite's own hook leaves them (the
    order xdist hands them out in), collected without xdist."""
    (root / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-o", "addopts=", "--import-mode=importlib", "--rootdir", str(root), str(root)],
        capture_output=True, text=True, timeout=120, env={**env, "PYTHONPATH": str(REPO)}, cwd=root,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_the_unit_tests_go_first_then_the_longest_files_then_the_rest(tmp_path):
    """The fast lane leads the full suite: every unit test is handed out before any other file, so a
    broken unit or a lint finding fails an hour's run in its first minutes; after them the files of
    ``LONGEST_FIRST`` in its order, then the rest in collection order."""
    files = {
        "tests/browser/test_b.py": ["test_one"],
        "tests/integration/test_aaa_short.py": ["test_one", "test_two"],
        LONGEST_FIRST[-1]: ["test_one"],  # collected before LONGEST_FIRST[0] (alphabetical)
        LONGEST_FIRST[0]: ["test_one", "test_two"],
        "tests/unit/test_u1.py": ["test_one", "test_two"],
        "tests/unit/test_u2.py": ["test_one"],
    }
    for path, tests in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("".join(f"def {t}():\n    pass\n\n" for t in tests))
    order = _collected_order(tmp_path)
    assert sorted(order) != order  # pytest collects them alphabetically: the hook reorders
    assert order == [
        "tests/unit/test_u1.py::test_one",
        "tests/unit/test_u1.py::test_two",
        "tests/unit/test_u2.py::test_one",
        f"{LONGEST_FIRST[0]}::test_one",
        f"{LONGEST_FIRST[0]}::test_two",
        f"{LONGEST_FIRST[-1]}::test_one",
        "tests/browser/test_b.py::test_one",
        "tests/integration/test_aaa_short.py::test_one",
        "tests/integration/test_aaa_short.py::test_two",
    ]


def test_every_file_ranked_longest_first_exists():
    """A renamed or removed file would silently lose its rank and be handed out late."""
    assert [f for f in LONGEST_FIRST if not (REPO / f).is_file()] == []
