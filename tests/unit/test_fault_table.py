"""The README's "What the gate catches" section is generated: it must match the committed JSON and the matrix."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import asdict

from tests.conftest import REPO
from tests.faults.matrix import CONTROLS, ROWS, diagnosis_excerpt


def _load(name: str):
    """A script under scripts/ as a module (registered first: its dataclasses need that)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _script():
    return _load("make_fault_table")


def test_readme_section_is_the_rendering_of_the_committed_json():
    m = _script()
    matrix = json.loads(m.MATRIX_JSON.read_text())
    sensitivity = json.loads(m.SENSITIVITY_JSON.read_text()) if m.SENSITIVITY_JSON.is_file() else None
    readme = m.README.read_text()
    assert m.render_readme(readme, m.section(matrix, sensitivity)) == readme, (
        "README.md is stale: run `python scripts/make_fault_table.py`"
    )


def test_committed_rows_match_the_matrix_expectations():
    matrix = json.loads(_script().MATRIX_JSON.read_text())
    assert [r["id"] for r in matrix["rows"]] == [r.id for r in ROWS]
    for row, record in zip(ROWS, matrix["rows"]):
        expected = json.loads(json.dumps(asdict(row)))  # tuples as JSON lists
        assert {k: record[k] for k in expected} == expected, f"row {row.id}: regenerate docs/fault_matrix.json"
        assert record["observed_status"] in row.statuses
        assert row.excerpt in record["observed_diagnosis"]
    assert [c["id"] for c in matrix["controls"]] == [c.id for c in CONTROLS]
    for c in matrix["controls"]:
        assert c["counts"]["checks_verdict"]["FAIL"] == 0 and c["seeds"] >= 20


def test_diagnosis_excerpt_shows_the_finding_and_the_needle_cut_at_words():
    text = "Finding here. Then " + "word " * 30 + "NEEDLE in the middle " + "tail " * 60 + "end."
    out = diagnosis_excerpt(text, "NEEDLE", width=80)
    finding, rest = out.split(" … ")
    assert finding == "Finding here." and "NEEDLE" in rest and rest.startswith("...") and rest.endswith("...")
    assert diagnosis_excerpt("Short. The fix is X.", "fix") == "Short. … The fix is X."
    assert diagnosis_excerpt("The fix is X. More.", "fix") == "The fix is X."
    long_first = "A " + "b " * 200 + "NEEDLE."
    assert diagnosis_excerpt(long_first, "NEEDLE", width=60).endswith("NEEDLE.")


def test_table_cells_escape_pipes():
    assert _script().cell("mean |d| < 1\nnext") == "mean \\|d\\| < 1 next"


def _sweep():
    return _load("sensitivity_sweep")


def test_detection_threshold_needs_a_quiet_a_a_and_a_stable_detection():
    s = _sweep()

    def cells(aa: int, flagged: dict[float, int]):
        return [s.Point(None, 80, 32, aa, 20, {})] + [s.Point(sig, 80, 32, f, 20, {}) for sig, f in flagged.items()]

    assert s.detection_threshold(cells(0, {0.0: 0, 0.01: 3, 0.02: 19, 0.03: 20}), 80, 32, 19) == 0.02
    # a lucky 19 below a miss does not count: every larger sigma must hold it too
    assert s.detection_threshold(cells(0, {0.01: 19, 0.02: 17, 0.03: 20}), 80, 32, 19) == 0.03
    assert s.detection_threshold(cells(0, {0.01: 5, 0.02: 18}), 80, 32, 19) is None  # not reached in the grid
    assert s.detection_threshold(cells(1, {0.01: 20}), 80, 32, 19) is None  # A/A flagged: no claim
    assert s.detection_threshold(cells(0, {0.01: 20}), 40, 32, 19) is None  # no such cell
