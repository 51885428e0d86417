"""The engine worker: runs inside an engine environment (venv or container), never in the orchestrator."""
