"""A short, real GRPO run through the engine: the RL dynamics, not just one forward pass.

Per step: ``prompts_per_step`` prompts with a verifiable answer, ``group_size`` samples each from
the engine (its reported logprobs are the rollout policy's), reward 1 when the completion's last
integer equals the answer else 0, the advantages and policy loss grpo.loss selects
(gate/worker/policy_loss.py; by default group-normalised advantages and the PPO-clipped loss with the
importance ratio exp(lp_trainer - lp_rollout), a token mean over the batch), one optimizer
step (grpo.optimizer) on the parameters grpo.trainable selects, and an in-place push of the whole new
state dict into the running engine. The trainer holds the model in the engine's dtype, fp32 master
copies of what trains (gate.worker.trainable) and, to put the engine back at the checkpoint when the
run ends, the starting values of the trained parameters only: the frozen ones never move.

Per step it records what RL practitioners watch: mean reward, k3 KL(rollout || trainer) on the
sampled tokens, clip fraction, entropy of the trainer's sampling distribution, mean |d|,
token_mult_prob_error, response length, the share of groups whose samples are all identical, and
step time. A held-out eval set (never trained on) is sampled through the engine at the checkpoint
once, and after each seed's last step: the reward the trained policy reaches, the statistic
grpo-trajectory judges paired by seed against the baseline's seeds (gate/checks/grpo.py).

Every prompt of every step has its own sampling seed (:func:`sampling_seed`), so the samples a
prompt gets do not depend on which others share its batch, and the baseline, the old and the new
engine draw the same prompt schedule for the same seed. An engine whose logprobs are not those of
the distribution it sampled from (raw logprobs at T < 1) shows up from step 0 in KL and clip rate;
a broken update path shows up as a KL that grows step after step.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gate.contract import keys
from gate.contract.request import GrpoRequest
from gate.worker.policy_loss import PolicyLoss, advantages, policy_loss
from gate.worker.trainable import TrainableSet

_LAST_INT = re.compile(r"-?\d+")


@dataclass(frozen=True)
class GrpoRun:
    """A GRPO run's arrays (per step ``grpo_<metric>`` [seeds, steps], and the eval's) and its
    trainer's record."""

    arrays: dict[str, np.ndarray]
    trainer: dict[str, Any]  # what trained, with which optimizer, and the memory that kept
    eval_s: float  # seconds spent sampling the eval set, every seed's and the checkpoint's


def reward(text: str, answer: str) -> float:
    """1.0 when the last integer in the completion equals the answer (exact match), else 0.0."""
    found = _LAST_INT.findall(text)
    return 1.0 if found and found[-1] == answer.strip() else 0.0


# One rollout: per prompt, per sample, (token ids, the engine's logprob of each, text).
Samples = list[list[tuple[list[int], list[float], str]]]
# (prompts, n, temperature, max_tokens, one seed per prompt) -> Samples
Rollout = Callable[[list[list[int]], int, float, int, list[int]], Samples]

# Streams of sampling seeds: the training rollouts, the trained policies' evals, the checkpoint's.
TRAIN, EVAL, EVAL0 = 0, 1, 2
_SLOTS = (
    2**24
)  # seeds per (offset, run seed, stream): a slot's n children take slot*n .. slot*n+n-1


def sampling_seed(offset: int, seed: int, stream: int, slot: int, n: int) -> int:
    """The vLLM seed of one prompt's request: distinct for every (offset, run seed, stream, slot),
    and spaced by ``n`` because vLLM seeds an n-sample request's children ``seed + i``."""
    if not 0 <= slot * n + n <= _SLOTS:
        raise ValueError(f"grpo: slot {slot} x n {n} leaves the seed stream's {_SLOTS} seeds")
    return ((offset * 1_000_003 + seed) * 3 + stream) * _SLOTS + slot * n


def offline_rollout(llm) -> Rollout:
    """Samples from a ``vllm.LLM`` (its reported logprobs are the rollout policy's)."""

    def rollout(
        prompts: list[list[int]], n: int, temperature: float, max_tokens: int, seeds: list[int]
    ) -> Samples:
        from gate.worker.replay import _params

        params = [
            _params(n=n, temperature=temperature, max_tokens=max_tokens, seed=s, logprobs=0)
            for s in seeds
        ]
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [
            [
                (list(c.token_ids), _sampled_logprobs(c.logprobs, list(c.token_ids)), c.text)
                for c in out.outputs
            ]
            for out in outputs
        ]

    return rollout


def run_grpo(
    llm,
    model_path: str,
    prompt_ids: list[list[int]],
    answers: list[str | None],
    request: GrpoRequest,
    push: Callable,
    progress,
    hf_kwargs: dict | None = None,
    rollout: Rollout | None = None,
    dtype: torch.dtype | None = None,
) -> GrpoRun:
    """One GRPO run per seed: ``grpo_<metric>`` arrays of shape [seeds, steps], and the trainer's record.

    ``llm`` is what ``push`` takes first (a ``vllm.LLM``, or a server's base URL in server mode);
    ``rollout`` and ``dtype`` default to that LLM's sampling and weight dtype.
    """
    from transformers import AutoModelForCausalLM

    from gate.worker.trainable import (
        initial_values,
        make_optimizer,
        optimizer_state_bytes,
        restored_state_dict,
        select_trainable,
        trainer_record,
    )
    from gate.worker.weight_sync import _load_trainer, engine_dtype

    held_out = set(request.eval_prompts) if request.eval_held_out else set()
    usable = [i for i, a in enumerate(answers) if a and i not in held_out]
    if not usable:
        raise RuntimeError(
            "grpo: the prompt sets hold no record with an `answer` outside the eval set; the "
            "reward needs one"
        )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # Frozen weights as the engine holds them; trained ones get fp32 masters.
    dtype = dtype if dtype is not None else engine_dtype(llm)
    rollout = rollout if rollout is not None else offline_rollout(llm)
    evaluate = _Evaluation(rollout, prompt_ids, answers, request)
    names = (*keys.GRPO_METRICS, *(f"{m}_se" for m in keys.GRPO_WITH_SE))
    results = {m: np.zeros((len(request.seeds), request.steps)) for m in names}
    eval_success = np.zeros((len(request.seeds), len(request.eval_prompts)))
    eval0 = np.zeros(len(request.eval_prompts))
    for s_idx, seed in enumerate(request.seeds):
        torch.manual_seed(seed)
        model = _load_trainer(AutoModelForCausalLM, model_path, device, hf_kwargs, dtype).train()
        # Freshly loaded, the model is the checkpoint: every run starts from it, whatever ran before.
        push(llm, _weights(model))
        trained = select_trainable(model, request.trainable)
        # Only what trains moves: its starting values are the whole copy needed to restore the engine.
        initial = initial_values(trained)
        opt = make_optimizer(trained, request.optimizer, request.lr)
        if s_idx == 0:
            _say_what_trains(progress, request, trained)
            if request.eval_prompts:  # the checkpoint: one policy for every seed, evaluated once
                eval0 = evaluate(EVAL0, 0)
                progress(f"grpo eval of the checkpoint: reward {eval0.mean():.3f}")
        rng = np.random.default_rng(seed)
        for step in range(request.steps):
            start = time.perf_counter()
            batch = rng.choice(
                usable, size=min(request.prompts_per_step, len(usable)), replace=False
            )
            metrics = _step(
                rollout,
                model,
                trained,
                opt,
                [prompt_ids[i] for i in batch],
                [answers[i] for i in batch],
                request,
                _step_seeds(request, seed, step, len(batch)),
                device,
            )
            pushed = time.perf_counter()
            push(llm, _weights(model))
            metrics["push_s"] = time.perf_counter() - pushed
            metrics["step_s"] = time.perf_counter() - start
            for m in names:
                results[m][s_idx, step] = metrics[m]
            progress(
                f"grpo seed {seed} step {step + 1}/{request.steps}: reward {metrics['reward']:.2f}, "
                f"k3 {metrics['k3_kl']:.1e}, clip {metrics['clip_frac']:.1%}, {metrics['step_s']:.1f}s"
            )
        if request.eval_prompts:  # the engine holds this seed's last push: the trained policy
            eval_success[s_idx] = evaluate(EVAL, seed)
            progress(f"grpo seed {seed} eval: reward {eval_success[s_idx].mean():.3f}")
    push(llm, restored_state_dict(model, trained, initial))
    objective = policy_loss_of(request)
    record = trainer_record(trained, request.optimizer, optimizer_state_bytes(opt)) | {
        "loss": objective.name,
        "clip_band": [objective.eps_low, objective.eps_high],
    }
    arrays: dict[str, np.ndarray] = {keys.grpo_key(m): v for m, v in results.items()}
    if request.eval_prompts:
        arrays |= {
            keys.GRPO_EVAL_PROMPT_INDEX: np.asarray(request.eval_prompts, dtype=np.int64),
            keys.GRPO_EVAL0_SUCCESS: eval0,
            keys.GRPO_EVAL_SUCCESS: eval_success,
        }
    return GrpoRun(arrays, record, evaluate.seconds)


def _weights(model) -> dict[str, torch.Tensor]:
    """The whole state dict a push sends, detached from the trainer's graph."""
    return {k: v.detach() for k, v in model.state_dict().items()}


def _step_seeds(request: GrpoRequest, seed: int, step: int, prompts: int) -> list[int]:
    """Each rollout prompt's sampling seed at ``step`` of run seed ``seed``."""
    first = step * request.prompts_per_step
    return [
        sampling_seed(request.sampling_seed_offset, seed, TRAIN, first + i, request.group_size)
        for i in range(prompts)
    ]


def _say_what_trains(progress, request: GrpoRequest, trained: TrainableSet) -> None:
    objective = policy_loss_of(request)
    progress(
        f"grpo trains {trained.trainable_parameters:,} of {trained.total_parameters:,} "
        f"parameters ({request.trainable}) with {request.optimizer} on the {objective.name} loss, "
        f"clip band [1 - {objective.eps_low:g}, 1 + {objective.eps_high:g}]"
        + (" (lm_head is tied: the input embeddings train with it)" if trained.tied_lm_head else "")
    )


class _Evaluation:
    """The held-out eval set sampled through the engine as it stands: each prompt
    ``eval_samples`` times at the run's temperature, success = the reward. One generate call for
    the whole set."""

    def __init__(self, rollout: Rollout, prompt_ids, answers, request: GrpoRequest):
        self.rollout, self.request = rollout, request
        self.prompts = [prompt_ids[i] for i in request.eval_prompts]
        self.answers = [answers[i] for i in request.eval_prompts]
        self.seconds = 0.0

    def __call__(self, stream: int, seed: int) -> np.ndarray:
        """[eval prompts] success rates; the seeds come from ``stream`` and the run's seed."""
        r, start = self.request, time.perf_counter()
        seeds = [
            sampling_seed(r.sampling_seed_offset, seed, stream, i, r.eval_samples)
            for i in range(len(self.prompts))
        ]
        outputs = self.rollout(self.prompts, r.eval_samples, r.temperature, r.max_tokens, seeds)
        success = np.asarray(
            [
                [reward(text, a) for _, _, text in out]
                for out, a in zip(outputs, self.answers, strict=True)
            ]
        )
        self.seconds += time.perf_counter() - start
        return success.mean(axis=1)


def _step(
    rollout: Rollout,
    model,
    trained: TrainableSet,
    opt,
    prompts,
    answers,
    request: GrpoRequest,
    seeds: list[int],
    device,
) -> dict[str, float]:
    from gate.worker.trainable import optimizer_step, zero_grad

    outputs = rollout(prompts, request.group_size, request.temperature, request.max_tokens, seeds)
    seqs, starts, rollout_lp, rewards, lengths = [], [], [], [], []
    for p, out, answer in zip(prompts, outputs, answers, strict=True):
        for tokens, logprobs, text in out:
            seqs.append(p + tokens)
            starts.append(len(p))
            rollout_lp.append(np.asarray(logprobs, dtype=np.float64))
            rewards.append(reward(text, answer))
            lengths.append(len(tokens))
    rewards_arr = np.asarray(rewards).reshape(len(prompts), request.group_size)
    objective = policy_loss_of(request)
    adv = advantages(rewards_arr, objective)

    lp_trainer, entropy = _trainer_logprobs(model, seqs, starts, request.temperature, device)
    lp_roll = torch.tensor(np.concatenate(rollout_lp), dtype=torch.float32, device=device)
    seq_adv = torch.tensor(adv.reshape(-1), dtype=torch.float32, device=device)
    d = lp_trainer - lp_roll
    loss, clipped = policy_loss(d, seq_adv, lengths, objective)
    zero_grad(trained, opt)
    loss.backward()
    optimizer_step(trained, opt)

    dd = d.detach().double().cpu().numpy()
    per_token = {
        "k3_kl": np.expm1(dd) - dd,
        "clip_frac": clipped.cpu().numpy().astype(np.float64),
        "entropy": entropy.double().cpu().numpy(),
        "mean_abs_diff": np.abs(dd),
        "token_mult_prob_error": np.exp(np.abs(dd)),
    }
    lengths_arr = np.asarray(lengths)
    metrics = {"identical_groups": identical_share(outputs)}
    for name, values in per_token.items():
        metrics[name] = float(values.mean()) if len(values) else math.nan
        metrics[f"{name}_se"] = token_mean_se(values, lengths_arr)
    per_prompt = {"reward": rewards_arr, "response_length": lengths_arr.reshape(rewards_arr.shape)}
    for name, values in per_prompt.items():
        metrics[name] = float(values.mean())
        metrics[f"{name}_se"] = group_mean_se(values)
    return metrics


def identical_share(outputs: Samples) -> float:
    """The share of groups (one prompt's samples) that are all one completion. At T > 0 a group of
    8 identical answers happens for a short, confident answer now and then; every group identical
    is a sampler whose children share one seed, and a zero advantage everywhere."""
    same = [all(tokens == group[0][0] for tokens, _, _ in group) for group in outputs if group]
    return float(np.mean(same)) if same else math.nan


def policy_loss_of(request: GrpoRequest) -> PolicyLoss:
    """The request's objective; a request without an upper edge clips symmetrically."""
    high = request.clip_eps if request.clip_eps_high is None else request.clip_eps_high
    return PolicyLoss(request.loss, request.clip_eps, high, request.max_tokens)


def token_mean_se(values: np.ndarray, lengths: np.ndarray) -> float:
    """Standard error of a mean over all tokens, the sequences as independent units.

    Tokens of one sequence are not independent (one bad position shifts the next), so the mean is
    treated as the ratio sum(S_i) / sum(L_i) of per-sequence sums S_i and lengths L_i, and its
    variance estimated from the sequences' residuals S_i - mean * L_i.
    """
    total, n = lengths.sum(), np.count_nonzero(lengths)
    if total == 0 or n < 2:
        return math.nan
    sums = _segment_sums(values, lengths)
    residual = sums - values.mean() * lengths[lengths > 0]
    return float(math.sqrt(n / (n - 1) * np.sum(residual**2)) / total)


def group_mean_se(values: np.ndarray) -> float:
    """Standard error of the mean of [prompts, samples]: the samples of one prompt share it, so the
    prompts' means are the independent units."""
    means = values.mean(axis=1)
    return float(means.std(ddof=1) / math.sqrt(len(means))) if len(means) > 1 else math.nan


def _segment_sums(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per-sequence sums of a flat per-token array, the sequences of zero length left out."""
    nonzero = lengths[lengths > 0]
    starts = np.concatenate([[0], np.cumsum(nonzero)[:-1]])
    return np.add.reduceat(values.astype(np.float64), starts)


def _sampled_logprobs(logprobs, tokens: list[int]) -> list[float]:
    if hasattr(logprobs, "start_indices"):  # flat: [sampled] per position with logprobs=0
        return list(logprobs.logprobs)[: len(tokens)]
    return [entry[t].logprob for t, entry in zip(tokens, logprobs, strict=True)]


def _trainer_logprobs(
    model, seqs, starts, temperature: float, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced logprobs (with grad) of the completion tokens under temperature T, and the
    entropy of the trainer's distribution at each of them (no grad)."""
    lengths = [len(s) for s in seqs]
    max_len = max(lengths)
    ids = torch.zeros((len(seqs), max_len), dtype=torch.long)
    mask = torch.zeros((len(seqs), max_len), dtype=torch.long)
    for row, seq in enumerate(seqs):  # one step per sequence
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    ids, mask = ids.to(device), mask.to(device)
    counts = np.asarray(lengths) - np.asarray(starts)
    rows = torch.from_numpy(np.repeat(np.arange(len(seqs)), counts)).to(device)
    cols = torch.from_numpy(
        np.concatenate([np.arange(s - 1, n - 1) for s, n in zip(starts, lengths, strict=True)])
    ).to(device)
    # The head only where a completion token is predicted: over a 49k-150k vocabulary the
    # [batch, length, vocab] logits of every prompt position are most of the step's memory.
    hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    logits = model.get_output_embeddings()(hidden[rows, cols]).float()
    softcap = getattr(model.config, "final_logit_softcapping", None)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    logp = torch.log_softmax(logits / max(temperature, 1e-6), dim=-1)
    lp = logp.gather(-1, ids[rows, cols + 1].unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logp.exp() * logp).sum(-1)
    return lp, entropy
