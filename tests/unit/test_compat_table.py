"""docs/compatibility.md is generated: it must equal the rendering of the cached vLLM sources."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from gate import compat, vllm_source
from tests.conftest import REPO


def _script():
    spec = importlib.util.spec_from_file_location(
        "make_compat_table", REPO / "scripts" / "make_compat_table.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_compat_table"] = module
    spec.loader.exec_module(module)
    return module


def test_the_committed_table_is_what_the_checker_reads_from_the_cache():
    cold = [v for v in compat.RELEASES if vllm_source.cached_source(v) is None]
    if cold:
        pytest.skip(f"vLLM source cache is cold for {len(cold)} of {len(compat.RELEASES)} releases ({cold[0]}…) under "
                    f"{vllm_source.cache_root()}: run `pytest -m compat` or `python scripts/make_compat_table.py`")  # fmt: skip
    m = _script()
    assert m.PAGE.read_text(encoding="utf-8") == m.render(m.collect(fetch=False)), (
        "docs/compatibility.md is stale: run `python scripts/make_compat_table.py`"
    )


def test_release_ranges_merge_only_consecutive_equal_values():
    m = _script()
    assert m._ranges(["a", "b", "c", "d"], ["x", "x", "y", "x"]) == [
        ("a–b", "x"),
        ("c", "y"),
        ("d", "x"),
    ]
