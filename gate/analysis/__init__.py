"""What several checks measure the same way: models of the sampler, the engine's settings and its
stop tokens, computed on evidence.

- ``support``: the probability mass the sampler's top-k / top-p keeps, and the trainer that does
  not renormalise over it;
- ``temperature_fit``: the engine's effective temperature fitted from its top-k logprobs, and the
  logit noise between engine and trainer;
- ``nucleus_edge``: whether a sampled token lies decidably outside the requested transform;
- ``prefill_decode``: the engine's decode logprobs against its own prefill of the same tokens;
- ``setting_meaning``: what a recorded engine setting means, across releases that spell it otherwise;
- ``server_defaults``: the sampling defaults a server fills in;
- ``stop_tokens``: stop tokens one engine honoured and the other went past;
- ``paired``: Student's t without scipy, and the paired per-seed test the GRPO run is judged by;
- ``grpo_seeds``: a GRPO run reduced to one number per seed and statistic (eval reward, k3 growth,
  entropy drift, identical groups).

The checks (gate.checks) judge with these; nothing here gives a verdict.
"""
