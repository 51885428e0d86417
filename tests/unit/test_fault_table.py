"""scripts/make_fault_table.py: a test run's fault-matrix records become docs/fault_matrix.json and the
generated section of docs/validation.md, and the committed files are what it makes of themselves."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import REPO
from tests.faults import matrix
from tests.faults.matrix import CONTROLS, ROWS, FaultRow, diagnosis_excerpt


def _load(name: str) -> ModuleType:
    """A script under scripts/ as a module (registered first: its dataclasses need that)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def script() -> ModuleType:
    return _load("make_fault_table")


@pytest.fixture
def outputs(script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The script writing into tmp_path: a page with the markers, no JSON yet, no sensitivity sweep
    and no noise study."""
    page = tmp_path / "validation.md"
    page.write_text(
        f"# Validation\n\nBefore.\n\n{script.BEGIN}\nold table\n{script.END}\n\nAfter.\n"
    )
    monkeypatch.setattr(script, "PAGE", page)
    monkeypatch.setattr(script, "MATRIX_JSON", tmp_path / "fault_matrix.json")
    monkeypatch.setattr(script, "SENSITIVITY_JSON", tmp_path / "no-sensitivity.json")
    monkeypatch.setattr(script, "NOISE_JSON", tmp_path / "no-noise-study.json")
    return script


def _report(row: FaultRow, status: str) -> dict[str, Any]:
    """What an engine test's run reports for the row's check: a finding with a path and a pipe, then the fix."""
    diagnosis = (f"The new engine differs in {REPO}/gate/worker/replay.py where mean |d| moved. "
                 f"Fix: {row.excerpt} as the old engine did.")  # fmt: skip
    check = {
        "id": row.check,
        "status": status,
        "summary": f"{row.check} {status}",
        "diagnosis": diagnosis,
    }
    return {"verdict": status, "checks": [check]}


def _record_a_test_run(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row and control recorded as the engine tests record them (matrix.verify / record_control)."""
    monkeypatch.setenv(matrix.RECORDS_ENV, str(folder))
    for row in ROWS:
        matrix.verify(row.id, _report(row, row.statuses[-1]))
    for control in CONTROLS:
        counts = {"checks_verdict": {"FAIL": 0, "WARN": 1, "PASS": 19}, "verdict": {"FAIL": 0, "WARN": 2, "PASS": 18},
                  "bit_identical_samples": 20, "max_abs_teacher_forced_diff": 0.0}  # fmt: skip
        matrix.record_control(
            control.id, {"counts": counts, "seeds": list(range(20)), "wall_s": 61.0}
        )


def test_the_committed_json_and_page_are_what_the_script_makes_of_them(script: ModuleType):
    """Regenerating from the committed records changes nothing: the descriptions are the matrix's
    as it is now, every observation satisfies its row, and the page shows exactly this rendering."""
    committed = json.loads(script.MATRIX_JSON.read_text(encoding="utf-8"))
    assert script.merge_records(None, committed) == committed, (
        "docs/fault_matrix.json is stale: run `python scripts/make_fault_table.py`"
    )
    sensitivity = json.loads(script.SENSITIVITY_JSON.read_text(encoding="utf-8"))
    noise = json.loads(script.NOISE_JSON.read_text(encoding="utf-8"))
    page = script.PAGE.read_text(encoding="utf-8")
    assert script.render_page(page, script.section(committed, sensitivity, noise)) == page, (
        f"{script.PAGE.relative_to(REPO)} is stale: run `python scripts/make_fault_table.py`"
    )


def test_a_test_runs_records_become_the_json_and_the_table(
    outputs: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    _record_a_test_run(tmp_path / "records", monkeypatch)
    assert outputs.main([str(tmp_path / "records")]) == 0

    written = json.loads(outputs.MATRIX_JSON.read_text(encoding="utf-8"))
    assert [r["id"] for r in written["rows"]] == [r.id for r in ROWS]
    assert [c["id"] for c in written["controls"]] == [c.id for c in CONTROLS]
    for row, record in zip(ROWS, written["rows"], strict=True):
        assert record["observed_status"] == row.statuses[-1] and record["statuses"] == list(
            row.statuses
        )
        assert str(REPO) not in record["diagnosis"]  # no machine paths in a committed file
        assert row.excerpt in record["observed_diagnosis"]

    page = outputs.PAGE.read_text(encoding="utf-8")
    assert page.startswith("# Validation\n\nBefore.\n\n") and page.endswith(
        f"{outputs.END}\n\nAfter.\n"
    )
    assert "old table" not in page
    table_rows = [
        line for line in page.splitlines() if line.startswith("| ") and not line.startswith("| #")
    ]
    assert [line.split(" | ")[0] for line in table_rows[1:]] == [f"| {r.id}" for r in ROWS]
    assert all(
        "mean \\|d\\| moved" in line for line in table_rows[1:]
    )  # a pipe in a diagnosis stays in its cell
    assert "checks FAIL in 0 of 20 seeds, WARN in 1" in page

    # from the committed JSON alone (no records): the same files, byte for byte
    before = outputs.MATRIX_JSON.read_bytes(), outputs.PAGE.read_bytes()
    assert outputs.main([]) == 0
    assert (outputs.MATRIX_JSON.read_bytes(), outputs.PAGE.read_bytes()) == before


def test_rows_the_run_did_not_produce_keep_their_previous_observations(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    previous = json.loads(script.MATRIX_JSON.read_text(encoding="utf-8"))
    monkeypatch.setenv(matrix.RECORDS_ENV, str(tmp_path))
    rerun = ROWS[0]
    matrix.verify(rerun.id, _report(rerun, rerun.statuses[0]))
    merged = script.merge_records(tmp_path, previous)
    assert merged["rows"][0]["observed_summary"] == f"{rerun.check} {rerun.statuses[0]}"
    assert merged["rows"][1:] == previous["rows"][1:]
    assert merged["controls"] == previous["controls"]


def test_records_that_contradict_their_row_or_are_missing_are_refused(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    _record_a_test_run(tmp_path, monkeypatch)
    row = ROWS[0]
    path = tmp_path / f"{row.id}.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**record, "observed_status": "PASS"}), encoding="utf-8")
    with pytest.raises(SystemExit, match=f"{row.id}: {row.check} PASS, expected {row.check} FAIL"):
        script.merge_records(tmp_path, None)

    path.unlink()
    with pytest.raises(SystemExit, match=f"no record for \\['{row.id}'\\]"):
        script.merge_records(tmp_path, None)


def test_the_page_needs_its_markers(script: ModuleType):
    with pytest.raises(SystemExit, match="markers"):
        script.render_page("# a page without them\n", "table")


def test_diagnosis_excerpt_shows_the_finding_and_the_needle_cut_at_words():
    text = "Finding here. Then " + "word " * 30 + "NEEDLE in the middle " + "tail " * 60 + "end."
    out = diagnosis_excerpt(text, "NEEDLE", width=80)
    finding, rest = out.split(" … ")
    assert (
        finding == "Finding here."
        and "NEEDLE" in rest
        and rest.startswith("...")
        and rest.endswith("...")
    )
    assert diagnosis_excerpt("Short. The fix is X.", "fix") == "Short. … The fix is X."
    assert diagnosis_excerpt("The fix is X. More.", "fix") == "The fix is X."
    long_first = "A " + "b " * 200 + "NEEDLE."
    assert diagnosis_excerpt(long_first, "NEEDLE", width=60).endswith("NEEDLE.")


def test_table_cells_escape_pipes(script: ModuleType):
    assert script.cell("mean |d| < 1\nnext") == "mean \\|d\\| < 1 next"


def test_detection_threshold_needs_a_quiet_a_a_and_a_stable_detection():
    s = _load("sensitivity_sweep")

    def cells(aa: int, flagged: dict[float, int]):
        return [s.Point(None, 80, 32, aa, 20, {})] + [
            s.Point(sig, 80, 32, f, 20, {}) for sig, f in flagged.items()
        ]

    assert (
        s.detection_threshold(cells(0, {0.0: 0, 0.01: 3, 0.02: 19, 0.03: 20}), 80, 32, 19) == 0.02
    )
    # a lucky 19 below a miss does not count: every larger sigma must hold it too
    assert s.detection_threshold(cells(0, {0.01: 19, 0.02: 17, 0.03: 20}), 80, 32, 19) == 0.03
    assert (
        s.detection_threshold(cells(0, {0.01: 5, 0.02: 18}), 80, 32, 19) is None
    )  # not reached in the grid
    assert s.detection_threshold(cells(1, {0.01: 20}), 80, 32, 19) is None  # A/A flagged: no claim
    assert s.detection_threshold(cells(0, {0.01: 20}), 40, 32, 19) is None  # no such cell


def test_committed_records_carry_no_machine_paths(script):
    cleaned = script._repo_relative({
        "a": f"hook {script.REPO}/tests/hooks/weight_update.py:skip_load",
        "b": "generation_config changed 'auto' -> '/work/pt-tmp/pytest-of-root/pytest-33/server-faults0/tiny-arith-topk20'",
    })  # fmt: skip
    assert cleaned == {"a": "hook tests/hooks/weight_update.py:skip_load",
                       "b": "generation_config changed 'auto' -> 'tiny-arith-topk20'"}  # fmt: skip
