import sys

from gate.worker.main import main

if __name__ == "__main__":  # vLLM spawns processes: the guard keeps them from re-running the worker
    sys.exit(main())
