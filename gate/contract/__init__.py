"""The seam between the orchestrator and an engine worker, declared once for both sides.

- :mod:`gate.contract.request`: the request the orchestrator writes (request.json, versioned);
- :mod:`gate.contract.keys`: every array of evidence.npz with its pass and axis, and the evidence
  schema version;
- :mod:`gate.contract.engine_record`: engine.json, typed;
- :mod:`gate.contract.evidence`: one engine's output folder, loaded and validated.

The worker imports this package inside each engine environment: numpy, msgspec (every vLLM release
depends on it) and the standard library only.
"""
