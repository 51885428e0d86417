"""Server mode's engine: what a running server says about itself, its weight push, and
:class:`ServedEngine`, the engine handle (gate.worker.engine_handle) the passes drive over HTTP.

The passes are :mod:`gate.worker.passes`' one table: the replay passes go through the server's
completions and prompt logprobs; the weight-sync probe, the in-flight phase and the GRPO run are
the offline ones, given the server's greedy and sampling over HTTP and a push through the server.

Settings are read from the live server (``/server_info?config_format=json``, dev mode), the
defaults it fills into requests from its own start-up report (``Default vLLM sampling parameters
have been overridden by ...``), confirmed by a pair of requests (:func:`server_replay.confirm_effective`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gate.contract.request import InflightRequest, ServerRequest, WorkerRequest
from gate.worker import replay
from gate.worker import server_replay as http
from gate.worker.server import SERVED_MODEL_NAME, Server
from gate.worker.weight_digests import server_reader
from gate.worker.weight_push import (
    Adapter,
    UnsupportedEngine,
    load_hook,
    rpc_timeout_s,
    staged_weights,
    staging_roots,
)

if TYPE_CHECKING:
    from gate.worker.grpo import Rollout
    from gate.worker.weight_sync import ProbeTarget

# Dotted paths into /server_info's vllm_config for gate's settings (engine._SETTINGS, less the
# "vllm_config." prefix of the offline engine's attribute paths).
DEV_ENDPOINTS = ("/collective_rpc", "/reset_prefix_cache", "/pause", "/resume", "/server_info",
                 "/init_weight_transfer_engine", "/update_weights", "/tokenize", "/weight_checker")  # fmt: skip


@dataclass
class ServedEngine:
    """A healthy server and its client: the engine handle the passes drive in server mode."""

    server: Server
    command: list[str]  # the plain vLLM command the server process runs (gate.worker.serve)
    client: http.Client
    settings: ServerRequest
    config: dict[str, Any]  # /server_info's vllm_config (JSON); {} without dev mode
    defaults: dict[str, Any]  # the sampling defaults the server reported it fills in
    defaults_source: str | None
    bos_token_id: int | None
    facts: dict[str, Any] = field(
        default_factory=dict
    )  # engine.json "server", filled by the passes

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def setting(self, dotted: str) -> Any:
        cur: Any = self.config
        for part in dotted.split("."):
            if not isinstance(cur, dict):
                return None
            cur = cur.get(part)
        return cur

    # -- the engine handle (gate.worker.engine_handle.EngineHandle) --------------------------------
    over = " over HTTP"

    def sample(
        self,
        request: WorkerRequest,
        prompt_ids: list[list[int]],
        order: np.ndarray | None,
        say: Callable[[str], None],
    ) -> tuple[replay.Completions, dict[str, Any]]:
        """The rollout pass through the server, and what the server says it applied."""
        s, fields = request.sampling, self.settings.request_fields
        say(
            f"sampling {len(prompt_ids)} prompts x {s.n} over HTTP "
            f"(sending {', '.join(fields) or 'no sampling field'}; seed={s.seed})"
        )
        trainer_ids = [list(p) for p in prompt_ids]
        result = http.sample(self.client, request.prompts, trainer_ids, s, fields, order)
        # The engine saw the server's rendering of chat prompts: that is what the reference scores
        # and what tokenization compares between engines. Where it differs from the trainer's own
        # (apply_chat_template in this environment), the trainer and the server disagree.
        prompt_ids[:] = result.prompt_ids
        record = replay.prompt_ids_record(
            trainer_ids,
            result.engine_prompt_ids,
            [p.id for p in request.prompts],
            "server: "
            + ", ".join(f"{n} from {src}" for src, n in sorted(result.prompt_ids_source.items())),
        )
        unlike = record["unlike_trainer"]
        if unlike["count"]:
            say(
                f"warning: the server tokenized {unlike['count']} prompt(s) differently from the "
                f"trainer-side tokenizer (first: {unlike['ids'][0]})"
            )
        sent = http.sampling_fields(s, fields)
        confirmation = http.confirm_effective(
            self.client, result.prompt_ids[0], s, fields, self.defaults
        )
        self.facts |= {
            "request_fields": list(fields),
            "sent": sent,
            "reported_defaults": self.defaults,
            "reported_defaults_source": self.defaults_source,
            "applied_defaults": http.applied_defaults(sent, self.defaults),
            "effective_sampling": confirmation["effective"],
            "effective_confirmed": confirmation["confirmed"],
            "effective_check_max_abs_logprob_diff": confirmation["max_abs_logprob_diff"],
            "prompt_ids_source": result.prompt_ids_source,
            "prompts_tokenized_unlike_trainer": unlike["ids"],  # the first 20; prompt_ids has all
        }
        return result.completions, record

    def greedy(
        self, prompt_ids: list[list[int]], max_tokens: int, logprobs: int, order: np.ndarray | None
    ) -> replay.Completions:
        return http.greedy(self.client, prompt_ids, max_tokens, logprobs, order)

    def score_sequences(
        self, seqs: list[list[int]], order: np.ndarray | None
    ) -> replay.PromptScores:
        return http.score_sequences(self.client, seqs, order)

    def max_model_len(self) -> int:
        return int(self.setting("model_config.max_model_len") or 2048)

    def batch_invariance_unavailable(self) -> str | None:
        return (
            "server mode: the server batches requests as they arrive, so the batch compositions "
            "cannot be chosen (run this engine offline to measure it)"
        )

    def push_adapter(self, hook: str | None, scratch_dir: Path | None) -> Adapter:
        return choose_server_adapter(self, hook, scratch_dir)

    def push_facts(self) -> dict[str, Any]:
        return {"push_probe": self.facts.get("push_probe")}

    def probe_target(self, adapter: Adapter) -> ProbeTarget:
        from gate.worker.weight_sync import ProbeTarget

        return ProbeTarget(
            target=self.base_url,
            adapter=adapter,
            greedy=greedy_for_probe(self),
            block_size=int(self.setting("cache_config.block_size") or 16),
            bos_token_id=self.bos_token_id,
            max_model_len=self.max_model_len(),
            dtype=engine_dtype(self),
            digests=server_reader(
                self.client, (self.facts.get("push_probe") or {}).get("endpoints") or []
            ),
        )

    def inflight_driver(self, adapter: Adapter, request: InflightRequest) -> Any:
        from gate.worker.inflight_server import ServerDriver

        return ServerDriver(self, adapter, request.requests, engine_dtype(self))

    def grpo_target(self) -> tuple[Any, Rollout | None, torch.dtype | None]:
        return self.base_url, rollout(self), engine_dtype(self)


def connect(
    server: Server, command: list[str], settings: ServerRequest, bos_token_id: int | None
) -> ServedEngine:
    client = http.Client(
        server.base_url, settings.request_timeout_s, settings.max_in_flight, server.lines
    )
    config: dict[str, Any] = {}
    if settings.dev_mode:
        info = client.get("/server_info?config_format=json")
        config = info.get("vllm_config") if isinstance(info.get("vllm_config"), dict) else {}
    defaults, source = http.reported_defaults(server.lines())
    return ServedEngine(server, command, client, settings, config, defaults, source, bos_token_id)


def effective_settings(engine: ServedEngine, paths: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """gate's settings (engine._SETTINGS) as the server reports them; None where it does not."""
    found: dict[str, Any] = {}
    for name, candidates in paths.items():
        value = None
        for dotted in candidates:
            value = engine.setting(dotted.removeprefix("vllm_config."))
            if value is not None:
                break
        found[name] = (
            value.removeprefix("torch.") if isinstance(value, str) and name == "dtype" else value
        )
    return found


def identity(engine: ServedEngine) -> dict[str, Any]:
    import transformers
    import vllm

    return {
        "vllm": getattr(vllm, "__version__", "unknown"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "engine_class": "vllm.entrypoints.openai.api_server",
        "engine_generation": "V1",
        "device_kind": "cuda" if torch.cuda.is_available() else "cpu",
        "device_name": _device_name(),
        "platform": platform.platform(),
        "executable": sys.executable,
        "worker_multiproc_method": os.environ.get("VLLM_WORKER_MULTIPROC_METHOD"),
        "mode": "server",
    }


def _device_name() -> str:
    from gate.worker.engine import device_name

    return device_name()


def default_sampling(engine: ServedEngine) -> dict[str, Any]:
    """The values a request that sets nothing samples with: vLLM's, overridden by the server's defaults."""
    return {
        **http.NEUTRAL,
        "max_tokens": None,
        "seed": None,
        "skip_special_tokens": True,
        **engine.defaults,
    }


def engine_dtype(engine: ServedEngine) -> torch.dtype:
    dtype = getattr(
        torch, str(engine.setting("model_config.dtype") or "float32").removeprefix("torch."), None
    )
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


# -- the weight push through the server ----------------------------------------------------------


def probe_push(engine: ServedEngine) -> dict[str, Any]:
    """What this server offers for a weight push: its development endpoints, and whether its
    workers' ``reload_weights`` takes a folder (read from the worker class /server_info names)."""
    from gate.worker.weight_push import _import_class, accepts_keyword

    spec: dict[str, Any] = {}
    with contextlib.suppress(http.ServerError):
        spec = engine.client.get("/openapi.json").get("paths") or {}
    worker_cls = engine.setting("parallel_config.worker_cls")
    cls = _import_class(worker_cls) if isinstance(worker_cls, str) else None
    return {
        "dev_mode": engine.settings.dev_mode,
        "endpoints": sorted(p for p in DEV_ENDPOINTS if p in spec),
        "worker_cls": worker_cls,
        "reload_weights_path": cls is not None and accepts_keyword(cls, "weights_path"),
    }


def server_folder_push(
    base_url: str,
    state_dict: dict[str, torch.Tensor],
    client: http.Client,
    candidates: Sequence[Path],
) -> None:
    """The weights as one safetensors folder, every worker reloads from it (dev-mode
    ``/collective_rpc reload_weights(weights_path)``), then ``/reset_prefix_cache``: only a path
    travels over HTTP."""
    with staged_weights(state_dict, candidates) as folder:
        client.post(
            "/collective_rpc",
            {
                "method": "reload_weights",
                "kwargs": {"weights_path": str(folder)},
                "timeout": rpc_timeout_s(),
            },
        )
    client.post("/reset_prefix_cache", {})


def choose_server_adapter(
    engine: ServedEngine, hook: str | None, scratch_dir: Path | None
) -> Adapter:
    """The user's hook ``fn(base_url, state_dict)``, else the folder push where the server offers it;
    :class:`UnsupportedEngine` (SKIP, with the reason) where it does not."""
    found = engine.facts.get("push_probe") or probe_push(engine)  # probed once per request
    engine.facts["push_probe"] = found
    if hook:
        return Adapter(f"hook {hook} (base_url)", load_hook(hook))
    missing = [p for p in ("/collective_rpc", "/reset_prefix_cache") if p not in found["endpoints"]]
    if missing:
        raise UnsupportedEngine(
            f"the server offers no {missing} (development endpoints: set server.dev_mode, which sets "
            "VLLM_SERVER_DEV_MODE=1), so gate cannot push weights into it; or configure "
            "weight_update.hook with your stack's fn(base_url, state_dict)"
        )
    if not found["reload_weights_path"]:
        raise UnsupportedEngine(
            f"the server's workers ({found['worker_cls']}) have no reload_weights(weights_path) (vLLM < 0.16); "
            "configure weight_update.hook with your stack's fn(base_url, state_dict)"
        )
    push = partial(_push_with_client, client=engine.client, candidates=staging_roots(scratch_dir))
    return Adapter(
        "server /collective_rpc reload_weights(weights_path) + /reset_prefix_cache", push
    )


def _push_with_client(
    base_url: str,
    state_dict: dict[str, torch.Tensor],
    client: http.Client,
    candidates: Sequence[Path],
) -> None:
    server_folder_push(base_url, state_dict, client, candidates)


def greedy_for_probe(engine: ServedEngine):
    def greedy(prompts: list[list[int]], max_tokens: int):
        return http.greedy(engine.client, prompts, max_tokens, 1)

    return greedy


def rollout(engine: ServedEngine):
    """GRPO's rollout over HTTP: token-id prompts, every field set (the GRPO run's own settings),
    seeded as offline, so a server samples the same rollouts as the offline engine."""

    def sample(
        prompts: list[list[int]], n: int, temperature: float, max_tokens: int, seeds: list[int]
    ):
        def one(i: int):
            # Each prompt its own seed, as the offline rollout's SamplingParams per prompt.
            body = {
                "model": SERVED_MODEL_NAME,
                "prompt": prompts[i],
                "n": n,
                "temperature": temperature,
                "top_p": 1.0,
                "top_k": 0,
                "max_tokens": max_tokens,
                "seed": seeds[i],
                "logprobs": 0,
                "return_tokens_as_token_ids": True,
            }
            choices = http._choices(
                engine.client.post(http.COMPLETIONS, body), False, 0, n, f"grpo {i}"
            )
            return [(c.token_ids.tolist(), c.logprob.tolist(), c.text) for c in choices]

        return engine.client.map(one, list(range(len(prompts))))

    return sample


def server_record(engine: ServedEngine) -> dict[str, Any]:
    """engine.json ``server``: the command, where it listened, start-up time and what the passes found."""
    return {
        "command": engine.command,
        "launched_as": engine.server.command,
        "base_url": engine.base_url,
        "startup_s": engine.server.started_s,
        "dev_mode": engine.settings.dev_mode,
        "max_in_flight": engine.settings.max_in_flight,
        "http_requests": engine.client.requests,
        "http_retried": engine.client.retried,
        "settings": dataclasses.asdict(engine.settings),
        **engine.facts,
    }
