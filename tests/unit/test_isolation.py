"""tests/isolation.py: the guards that keep engine tests from leaning on each other's leftovers."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests import isolation

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_an_orphaned_grandchild_is_still_seen_and_is_killed():
    """The child exits at once and leaves its own child behind, as a dead server leaves its engine
    core: pytest is the subreaper (tests/conftest.py), so the orphan stays a descendant."""
    if not isolation.become_subreaper():  # idempotent; refused only where prctl is not allowed
        pytest.skip("this process may not become a child subreaper")
    before = set(isolation.live_descendants())
    code = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
    subprocess.run([sys.executable, "-c", code], check=True)
    left = isolation.leftover_processes(before, wait_s=0.5)
    assert len(left) == 1 and "time.sleep(60)" in next(iter(left.values())), left
    time.sleep(0.2)
    assert not set(isolation.live_descendants()) - before  # killed


def test_processes_that_exit_within_the_wait_are_not_leftovers():
    before = set(isolation.live_descendants())
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    assert isolation.leftover_processes(before, wait_s=10) == {}
    proc.wait()


def test_the_checkout_status_sees_a_new_file(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert isolation.checkout_changes(tmp_path) == set()
    (tmp_path / "left.txt").write_text("x")
    assert isolation.checkout_changes(tmp_path) == {"?? left.txt"}
    assert isolation.checkout_changes(tmp_path / "absent") is None
