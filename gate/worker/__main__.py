import os
import sys

from gate.worker.main import main

if __name__ == "__main__":  # vLLM spawns processes: the guard keeps them from re-running the worker
    code = main()
    # Every output file is written and closed by now; skip the interpreter's teardown of torch and
    # vLLM (seconds of atexit work that would only delay the orchestrator).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
