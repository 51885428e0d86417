"""gate: a CI gate for vLLM upgrades in reinforcement-learning training stacks.

The orchestrator (this package minus ``gate.worker``) imports neither vllm nor torch;
engine work happens in ``python -m gate.worker`` inside each engine's own environment.
"""

__version__ = "0.1.0"
