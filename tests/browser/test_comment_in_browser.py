"""The example comments as GitHub shows them: cmark-gfm, github-markdown-css, Mermaid 11, Chromium.

Marker ``browser``. The tools come from Debian (chromium, cmark-gfm) and the npm registry (mermaid,
github-markdown-css in $GATE_CACHE_DIR/browser); scripts/render_in_browser.py says how to get them.
Without them the test skips, except where the full suite must run (CI, .ci/run), where it fails.
One Chromium start per comment, about a second each.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import full_suite_required

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = ("pass", "warn", "fail", "merged")


def _script() -> Any:
    spec = importlib.util.spec_from_file_location(
        "render_in_browser", REPO / "scripts" / "render_in_browser.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


BROWSER = _script()


@pytest.fixture(scope="module")
def tools() -> Any:
    found, missing = BROWSER.find_tools()
    if found is None:
        message = "missing: " + "; ".join(missing)
        if full_suite_required():
            pytest.fail(
                f"CI or GATE_REQUIRE_DOCKER is set, so the browser test must run; {message}"
            )
        pytest.skip(message)
    return found


@pytest.fixture(scope="module")
def measured(tools, tmp_path_factory) -> dict[str, dict[str, Any]]:
    work = tmp_path_factory.mktemp("browser")
    return {
        name: BROWSER.measure(
            (REPO / "docs" / "examples" / f"{name}.md").read_text(encoding="utf-8"), tools, work
        )
        for name in EXAMPLES
    }


@pytest.mark.parametrize("name", EXAMPLES)
def test_nothing_overflows_the_comment_column(measured, name):
    m = measured[name]
    assert "page_error" not in m, m
    assert m["tables"], "no table was measured: the page did not render"
    assert m["overflow"] == [], m["overflow"]
    assert max(t["width"] for t in m["tables"]) <= BROWSER.COLUMN_PX


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_mermaid_chart_renders_with_the_fixed_palette(measured, name):
    m = measured[name]
    assert m["mermaid_errors"] == []
    assert m["palette_found"]
    charts = (
        (REPO / "docs" / "examples" / f"{name}.md").read_text(encoding="utf-8").count("```mermaid")
    )
    assert m["charts"] == charts


@pytest.mark.parametrize("name", ["warn", "fail", "merged"])
def test_first_screen_holds_the_verdict_and_the_fix(measured, name):
    m = measured[name]
    assert m["verdict_bottom"] is not None and m["verdict_bottom"] < 80
    assert m["fix_bottom"] is not None, "no **Fix:** in the comment"
    assert m["fix_bottom"] <= BROWSER.FIRST_SCREEN_PX, m["fix_bottom"]


def test_an_all_pass_comment_is_short_until_expanded(measured):
    m = measured["pass"]
    assert m["height_as_posted"] <= BROWSER.FIRST_SCREEN_PX
    assert m["height_expanded"] > 3 * m["height_as_posted"]  # the details are there, collapsed


def test_the_measurement_catches_a_table_wider_than_the_column(tools, tmp_path):
    """The page's own check: an unbreakable cell makes the table scroll, and that is reported."""
    wide = "## ❌ FAIL: x\n\n| a | b |\n| --- | --- |\n| " + "x" * 400 + " | y |\n"
    m = BROWSER.measure(wide, tools, tmp_path)
    assert [o["tag"] for o in m["overflow"]][:1] == ["table"]
    bad_chart = "## ❌ FAIL: x\n\n```mermaid\nxychart-beta\n    line [1, oops\n```\n"
    assert BROWSER.measure(bad_chart, tools, tmp_path)["mermaid_errors"]


def test_long_unbroken_values_wrap_inside_the_column(tools, tmp_path):
    """Values no example has: a long setting without spaces, a long spec, a long worst-token context."""
    from gate.render.markdown import render_comment
    from gate.report_model import Report

    r = json.loads((REPO / "docs" / "examples" / "fail.report.json").read_text(encoding="utf-8"))
    long = "x" * 150
    r["engines"]["new"]["spec"] = "vllm@https://example.invalid/" + long + ".whl"
    r["engines"]["new"]["effective"]["attention_backend"] = long
    parity = next(c for c in r["checks"] if c["id"] == "config-parity")
    parity["details"]["diff"]["attention_backend"] = {"old": None, "new": long}
    for t in next(c for c in r["checks"] if c["id"] == "train-inference-mismatch")["details"][
        "worst_tokens"
    ]:
        t["context"] = long
    m = BROWSER.measure(render_comment(Report.from_dict(r)).text, tools, tmp_path)
    assert m["overflow"] == [], m["overflow"]
