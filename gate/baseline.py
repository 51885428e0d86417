"""Baselines: reviewable reference evidence stored in the repository.

``baselines/<profile>/`` holds::

    manifest.json   provenance: engine (spec, versions, device), model sha256, prompt-set sha256s,
                    sampling and reference settings, gate version, date, the run it came from
    reference.npz   per-token reference arrays of the recorded engine (prompt ids, greedy tokens,
                    teacher-forced logprobs, sample lengths), same keys as evidence.npz
    noise.json      each metric's noise floor from an A/A calibration (old engine against itself)
    noise_design.json  how the floors were made: engine starts, pairs, every pair's reading, the
                    bound and the false-alarm rate it is designed for (absent in older baselines)
    summary.json    small, diffable figures: mismatch statistics, lengths, effective settings
    greedy.csv      one row per prompt: id, greedy token count, greedy completion

Only ``gate baseline record`` (refuses to overwrite) and ``gate baseline update`` (overwrites and
says what changed) write here; ``gate run`` never does.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import time
import zipfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from gate import __version__
from gate.analysis import grpo_seeds
from gate.analysis.nucleus_edge import decidably_outside
from gate.contract import evidence as ev
from gate.contract import keys
from gate.contract.engine_record import EngineRecord, EngineRecordError
from gate.contract.request import GRPO_SEED_SCHEME
from gate.device import numerics_difference
from gate.errors import ConfigError, GateError
from gate.files import recover_swap, staged_folder
from gate.metrics import mismatch
from gate.run_record import BaselineManifest, checked, read_run_manifest

MANIFEST = "manifest.json"
ARRAYS = "reference.npz"
NOISE = "noise.json"
SUMMARY = "summary.json"
GREEDY_CSV = "greedy.csv"
NOISE_DESIGN = "noise_design.json"  # the name gate.calibrate writes into its run directory
BASELINE_SCHEMA = 1

# The arrays a baseline keeps: enough to compare tokens, lengths and teacher-forced logprobs.
_KEPT = (
    keys.PROMPT_OFFSETS,
    keys.PROMPT_TOKEN_IDS,
    f"{keys.GREEDY}_{keys.OFFSETS}",
    f"{keys.GREEDY}_{keys.TOKEN_IDS}",
    f"{keys.GREEDY}_{keys.PROMPT_INDEX}",
    f"{keys.SAMPLE}_{keys.OFFSETS}",
    f"{keys.SAMPLE}_{keys.TOKEN_IDS}",
    f"{keys.SAMPLE}_{keys.PROMPT_INDEX}",
    f"{keys.TF}_{keys.PROMPT_INDEX}",
    f"{keys.TF}_input_offsets",
    f"{keys.TF}_input_ids",
    f"{keys.TF}_{keys.OFFSETS}",
    f"{keys.TF}_{keys.ENGINE_LOGPROB}",
)


class BaselineError(GateError):
    """A baseline folder is missing pieces or unreadable."""


@dataclass
class Baseline:
    path: Path
    manifest: dict[str, Any]
    evidence: ev.Evidence  # the kept arrays, with the same keys as a run's evidence
    noise: dict[str, float]
    noise_design: dict[str, Any] | None = None  # noise_design.json; None in older baselines
    # summary.json's train-inference figures of the recorded engine ({} in older baselines): what
    # train-inference-mismatch calls pre-existing when only the baseline stands for the old engine
    mismatch: dict[str, float] = field(default_factory=dict)

    @cached_property
    def engine(self) -> EngineRecord:
        """The recorded engine's settings and identity (the manifest's ``engine``, validated by
        :func:`load`), read once."""
        return EngineRecord.from_json(self.manifest.get("engine", {}), self.path / MANIFEST)


def load(path: Path) -> Baseline:
    path = Path(path)
    recover_swap(path)  # a record interrupted mid-swap put the previous baseline aside
    if not path.is_dir():
        raise BaselineError(
            f"{path}: baseline folder not found (record one with `gate baseline record`)"
        )
    for name in (MANIFEST, ARRAYS, NOISE):
        if not (path / name).is_file():
            raise BaselineError(f"{path / name}: missing from the baseline")
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        noise = json.loads((path / NOISE).read_text(encoding="utf-8"))
        with np.load(path / ARRAYS, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise BaselineError(f"{path}: unreadable baseline file: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != BASELINE_SCHEMA:
        raise BaselineError(f"{path / MANIFEST}: schema: expected {BASELINE_SCHEMA}")
    try:
        checked(manifest, BaselineManifest, path / MANIFEST)
    except ConfigError as exc:
        raise BaselineError(str(exc)) from None
    if not isinstance(noise, dict) or not all(isinstance(v, (int, float)) for v in noise.values()):
        raise BaselineError(f"{path / NOISE}: expected an object of metric name to number")
    missing = [k for k in _KEPT if k not in arrays]
    if missing:
        raise BaselineError(f"{path / ARRAYS}: {missing[0]}: missing")
    try:
        engine = EngineRecord.from_json(manifest.get("engine", {}), path / MANIFEST)
        evidence = ev.Evidence(path=path, arrays=arrays, engine=engine, texts={})
        ev.validate(evidence, ARRAYS)
    except (ev.EvidenceError, EngineRecordError) as exc:
        raise BaselineError(str(exc)) from None
    return Baseline(
        path=path,
        manifest=manifest,
        evidence=evidence,
        noise={k: float(v) for k, v in noise.items()},
        noise_design=_noise_design(path / NOISE_DESIGN),
        mismatch=_mismatch_summary(path / SUMMARY),
    )


def _mismatch_summary(path: Path) -> dict[str, float]:
    """summary.json's ``mismatch`` figures, numbers only; {} where the file predates them."""
    if not path.is_file():
        return {}
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BaselineError(f"{path}: unreadable: {exc}") from None
    figures = summary.get("mismatch", {}) if isinstance(summary, dict) else None
    if not isinstance(figures, dict):
        raise BaselineError(f"{path}: mismatch: expected an object of metric name to number")
    return {
        k: float(v)
        for k, v in figures.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def _noise_design(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BaselineError(f"{path}: unreadable: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), int):
        raise BaselineError(f"{path}: runs: expected an integer")
    return doc


def design_statement(d: dict | None, floors: dict[str, float] | None = None) -> str:
    """One line for the report: what the noise floors are and the false-alarm rate they are designed
    for. ``floors``: a baseline's noise.json, for baselines recorded before noise_design.json."""
    values = list((floors or {}).values()) or [
        m.get("floor") for m in (d or {}).get("metrics", {}).values()
    ]
    if values and not any(values):
        starts = f"{d['runs']} engine starts" if d else "the calibration's starts"
        return (
            f"noise floors 0: {starts} were bit-identical, so the thresholds' absolute floors apply"
        )
    if not d:
        return "noise floors from one A/A pair (no spread measured): false-alarm rate not designed"
    if d.get("false_alarm_rate") is None:
        return f"noise floors from {d['runs']} engine starts (one pair, no spread): false-alarm rate not designed"
    return (
        f"noise floors: {1 - d['false_alarm_rate']:.0%} upper prediction bound from {d['runs']} engine starts "
        f"({d['pairs']} pairs, df {d['df']}): one more A/A pair exceeds a floor with probability "
        f"{d['false_alarm_rate']:.0%}, and the checks' bounds (4x / 10x noise) far less"
    )


def provenance_differences(baseline: Baseline, run: dict[str, Any], new: ev.Evidence) -> list[str]:
    """Human sentences for every way the run's inputs differ from the baseline's (WARN by default).

    A different device *class* (cpu vs cuda) counts, and so does a CPU of another vector extension
    under bf16 or fp16 (:func:`host_difference`); another CPU or GPU model of the same class is only
    noted (see :func:`provenance_notes`): the checks' thresholds absorb that.
    """
    m, diffs = baseline.manifest, []
    if m["model"].get("sha256") != run["model"].get("sha256"):
        diffs.append(
            f"model sha256 {_short(run['model'].get('sha256'))} != baseline {_short(m['model'].get('sha256'))}"
        )
    run_sets = {p["name"]: p["sha256"] for p in run["prompt_sets"]}
    base_sets = {p["name"]: p["sha256"] for p in m["prompt_sets"]}
    if run_sets != base_sets:
        diffs.append(f"prompt sets {_sets(run_sets)} != baseline {_sets(base_sets)}")
    for key in ("sampling", "greedy", "reference", "lora"):
        if m.get(key) != run.get(key):
            diffs.append(f"{key} settings differ: run {run.get(key)} vs baseline {m.get(key)}")
    device, base_device = new.engine.device_kind, baseline.engine.device_kind
    if device != base_device:
        diffs.append(f"device class {device} != baseline {base_device}")
    if (host := host_difference(baseline, run)) is not None:
        diffs.append(host)
    return diffs


def host_difference(baseline: Baseline, run: dict[str, Any]) -> str | None:
    """Why the baseline's numbers do not carry over to the run's host (gate.device), or None."""
    dtype = baseline.engine.effective.get("dtype")
    return numerics_difference(baseline.manifest.get("device"), run.get("device"), dtype)


def provenance_notes(baseline: Baseline, new: ev.Evidence) -> list[str]:
    ident = new.engine.identity.fingerprint()
    base_ident = baseline.engine.identity.fingerprint()
    notes = []
    for key in ("device_name", "torch", "transformers"):
        if ident.get(key) != base_ident.get(key):
            notes.append(f"{key} {ident.get(key)!r} (baseline {base_ident.get(key)!r})")
    return notes


def comparable(baseline: Baseline, run: dict[str, Any]) -> bool:
    """Token-level comparisons need the same model, prompts and settings, and for bf16 on a CPU the
    same vector extension (:func:`host_difference`); another GPU of one kind is allowed."""
    m = baseline.manifest
    return (
        m["model"].get("sha256") == run["model"].get("sha256")
        and {p["name"]: p["sha256"] for p in m["prompt_sets"]}
        == {p["name"]: p["sha256"] for p in run["prompt_sets"]}
        and all(m.get(k) == run.get(k) for k in ("sampling", "greedy", "reference", "lora"))
        and host_difference(baseline, run) is None
    )


# The GRPO settings the baseline's seeds depend on (not how many there are): seeds recorded under
# other ones say nothing about this run's. ``seed_scheme`` is how sampling seeds are derived
# (GRPO_SEED_SCHEME); a baseline from before it was recorded has none and is not of this design.
GRPO_DESIGN = (
    "steps", "prompts_per_step", "group_size", "max_tokens", "temperature", "lr", "loss", "clip_eps",
    "clip_eps_high", "trainable", "optimizer", "eval_prompts", "eval_samples", "eval_held_out",
    "seed_scheme",
)  # fmt: skip


def grpo_design(run: dict[str, Any]) -> dict[str, Any] | None:
    grpo = run.get("grpo")
    if not grpo or not grpo.get("enabled", True):
        return None
    return {k: grpo.get(k) for k in GRPO_DESIGN} | {"seed_scheme": GRPO_SEED_SCHEME}


def grpo_design_differences(baseline: Baseline, run: dict[str, Any]) -> list[str]:
    """``key: run vs baseline`` for each GRPO setting the baseline's seeds were recorded under and
    this run changes (a baseline without a GRPO record differs in all)."""
    recorded, current = baseline.manifest.get("grpo") or {}, grpo_design(run)
    if current is None:
        return []
    return [
        f"{k}: {current[k]!r} vs {recorded.get(k)!r}"
        for k in GRPO_DESIGN
        if current[k] != recorded.get(k)
    ]


def grpo_comparable(baseline: Baseline, run: dict[str, Any]) -> bool:
    """Whether the baseline's GRPO seeds are this run's null: the same model, prompt sets and GRPO
    design. Not the host: the statistics already treat two engines' samples as independent, which
    is what another CPU's rounding makes them."""
    m = baseline.manifest
    return (
        m["model"].get("sha256") == run["model"].get("sha256")
        and {p["name"]: p["sha256"] for p in m["prompt_sets"]}
        == {p["name"]: p["sha256"] for p in run["prompt_sets"]}
        and not grpo_design_differences(baseline, run)
    )


def noise_applies(baseline: Baseline, run: dict[str, Any], new: ev.Evidence) -> bool:
    """Whether the baseline's calibrated noise floors describe this run's noise.

    The floors are a property of the engine, device class, model and inputs, not of which draw the
    sampler made: a run with another sampling seed (``gate repeat``) has the same noise, although
    its samples are not token-comparable with the baseline's (:func:`comparable`).
    """
    m = baseline.manifest
    sampling = {k: v for k, v in (run.get("sampling") or {}).items() if k != "seed"}
    base_sampling = {k: v for k, v in (m.get("sampling") or {}).items() if k != "seed"}
    device = new.engine.device_kind
    base_device = baseline.engine.device_kind
    return (
        m["model"].get("sha256") == run["model"].get("sha256")
        and {p["name"]: p["sha256"] for p in m["prompt_sets"]}
        == {p["name"]: p["sha256"] for p in run["prompt_sets"]}
        and all(m.get(k) == run.get(k) for k in ("greedy", "reference", "lora"))
        and sampling == base_sampling
        and device == base_device
        and host_difference(baseline, run) is None
    )


def write(
    out: Path, run_dir: Path, engine: str, noise: dict[str, float], overwrite: bool, log
) -> list[str]:
    """Write a baseline from ``run_dir``'s evidence of ``engine``; returns what changed (update)."""
    run = read_run_manifest(run_dir)
    e = ev.load(run_dir / "engines" / engine)
    # A reference from an engine that ignores top-k/top-p would make every later run look wrong;
    # tokens on the nucleus edge (bf16 rounding, ties) are no sign of that.
    outside = decidably_outside(e, run.get("sampling") or {})
    if outside:
        raise GateError(
            f"{run_dir}: engine '{engine}' sampled {outside} token(s) that the requested top-k/top-p excludes; "
            "refusing to record a baseline from it"
        )
    previous = None
    if out.exists():
        if not overwrite:
            raise ConfigError(
                f"{out}: baseline already exists; `gate baseline update` overwrites it on purpose"
            )
        try:
            previous = load(out)
        except BaselineError as exc:
            log(f"replacing an unreadable baseline: {exc}")
    manifest = {
        "schema": BASELINE_SCHEMA,
        "gate_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "recorded_from": {
            "run": run_dir.name,
            "engine": engine,
            "spec": run["engines"][engine]["spec"],
        },
        # The engine record's settings and identity; no interpreter path: baselines are committed
        # and must not carry machine paths.
        "engine": {
            "effective": e.engine.effective,
            "default_sampling_params": e.engine.default_sampling_params,
            "generation_config_overrides": e.engine.generation_config_overrides,
            "dropped_engine_args": e.engine.dropped_engine_args,
            "identity": e.engine.identity.fingerprint(),
        },
        "model": {k: v for k, v in run["model"].items() if k != "path"},
        **({"device": run["device"]} if run.get("device") else {}),
        "prompt_sets": [
            {k: p[k] for k in ("name", "sha256", "records")} for p in run["prompt_sets"]
        ],
        "sampling": run["sampling"],
        "greedy": run["greedy"],
        "reference": run["reference"],
        **({"lora": run["lora"]} if run.get("lora") else {}),
    }
    if (design := grpo_design(run)) is not None and keys.GRPO_REWARD in e.arrays:
        manifest["grpo"] = design
    summary = _summary(e)
    # Written beside ``out``, then swapped in whole: a crash or an error leaves the old baseline.
    with staged_folder(out) as tmp:
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        (tmp / NOISE).write_text(
            json.dumps(noise, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        if (run_dir / NOISE_DESIGN).is_file():  # a calibration with more than one pair of starts
            shutil.copyfile(run_dir / NOISE_DESIGN, tmp / NOISE_DESIGN)
        (tmp / SUMMARY).write_text(
            json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        (tmp / GREEDY_CSV).write_text(_greedy_csv(e), encoding="utf-8")
        # per-seed trajectories: the band
        grpo = {k.name: e[k.name] for k in keys.keys_of(keys.GRPO) if e.has(k.name)}
        # Any, not ndarray: numpy >= 2.2's stub matches **arrays against savez's `allow_pickle: bool`,
        # a keyword numpy <= 2.1 (in the supported range) does not have, so it cannot be passed either.
        arrays: dict[str, Any] = {**{k: e[k] for k in _KEPT}, **grpo}
        np.savez_compressed(tmp / ARRAYS, **arrays)
        changes = _changes(previous, manifest, summary, noise) if previous else []
    return changes


def _summary(e: ev.Evidence) -> dict[str, Any]:
    g = keys.SAMPLE
    pairs = ev.sampled_pairs(e)  # as the checks read them: tokens on the nucleus edge left out
    stats = mismatch(pairs.trainer, pairs.engine, pairs.offsets)
    lengths = np.diff(e[f"{g}_{keys.OFFSETS}"])
    greedy_len = np.diff(e[f"{keys.GREEDY}_{keys.OFFSETS}"])
    return {
        "mismatch": {k: _round(v) for k, v in stats.to_dict().items()},
        "sample_length_mean": _round(float(lengths.mean())),
        "greedy_length_mean": _round(float(greedy_len.mean())),
        "teacher_forced_mean_logprob": _round(float(e[f"{keys.TF}_{keys.ENGINE_LOGPROB}"].mean())),
        "vllm": e.engine.identity.vllm,
        # mean over seeds per step, rounded: the reviewable face of the GRPO band
        "grpo_mean_per_step": {
            k.name.removeprefix(f"{keys.GRPO}_"): [
                _round(float(x)) for x in np.atleast_2d(e[k.name]).mean(axis=0)
            ]
            for k in keys.keys_of(keys.GRPO)
            if e.has(k.name) and k.name not in map(keys.grpo_key, keys.GRPO_TIMINGS)
        },
        # per statistic of grpo-trajectory, its seeds' mean and spread: the null a run is judged by
        **({"grpo_per_seed": _per_seed_summary(e)} if grpo_seeds.has_eval(e) else {}),
    }


def _per_seed_summary(e: ev.Evidence) -> dict[str, dict[str, Any]]:
    return {
        name: {
            "seeds": len(values),
            "mean": _round(float(values.mean())),
            "sd": _round(float(values.std(ddof=1))) if len(values) > 1 else None,
        }
        for name, values in grpo_seeds.per_seed(e).items()
    }


def _greedy_csv(e: ev.Evidence) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["prompt_id", "greedy_tokens", "greedy_text"])
    lengths = np.diff(e[f"{keys.GREEDY}_{keys.OFFSETS}"])
    for pid, n, text in zip(
        e.texts.get("prompt_ids", []), lengths.tolist(), e.texts.get("greedy_text", []), strict=True
    ):
        writer.writerow([pid, n, text])
    return buf.getvalue()


def _changes(previous: Baseline, manifest: dict, summary: dict, noise: dict) -> list[str]:
    changes = []
    old_m = previous.manifest
    for key in (
        "recorded_from",
        "model",
        "prompt_sets",
        "sampling",
        "greedy",
        "reference",
        "grpo",
        "lora",
    ):
        if old_m.get(key) != manifest.get(key):
            changes.append(f"{key}: {old_m.get(key)} -> {manifest.get(key)}")
    old_ident = previous.engine.identity.fingerprint()
    new_ident = EngineRecord.from_json(manifest["engine"]).identity.fingerprint()
    for key in ("vllm", "torch", "transformers", "device_name"):
        if old_ident.get(key) != new_ident.get(key):
            changes.append(f"engine {key}: {old_ident.get(key)} -> {new_ident.get(key)}")
    try:
        old_summary = json.loads((previous.path / SUMMARY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old_summary = {}
    for key in ("sample_length_mean", "greedy_length_mean", "teacher_forced_mean_logprob"):
        if old_summary.get(key) != summary.get(key):
            changes.append(f"{key}: {old_summary.get(key)} -> {summary.get(key)}")
    for key in sorted(set(previous.noise) | set(noise)):
        if previous.noise.get(key) != noise.get(key):
            changes.append(f"noise {key}: {previous.noise.get(key)} -> {noise.get(key)}")
    return changes


def _round(x: Any) -> Any:
    return float(f"{x:.6g}") if isinstance(x, float) else x


def _short(h: str | None) -> str:
    return (h or "none")[:12]


def _sets(sets: dict[str, str]) -> str:
    return ", ".join(f"{k}:{v[:12]}" for k, v in sorted(sets.items())) or "none"
