"""The run directory: where one ``gate run`` leaves its evidence.

Layout (docs/evidence.md)::

    <run>/run.json                    what ran: config, prompt-set and model hashes, engines, status
    <run>/engines/<old|new>/request.json, worker.log, evidence.npz, engine.json, texts.json

Work happens in ``<run>.incomplete/``; only a run whose engines all produced valid evidence is
renamed to ``<run>/``, so a crashed or failed run can never be mistaken for a complete one.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from gate.errors import ConfigError
from gate.files import INCOMPLETE_SUFFIX, RUN_FILE, swap_in


@dataclass
class RunDirectory:
    final_path: Path
    work_path: Path

    @classmethod
    def create(cls, out: Path | None, gate_id: str) -> RunDirectory:
        out = (out or default_path(gate_id)).resolve()
        if out.exists():
            raise ConfigError(f"{out}: run directory already exists; choose another --out")
        work = out.with_name(out.name + INCOMPLETE_SUFFIX)
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        return cls(final_path=out, work_path=work)

    def engine_dir(self, name: str) -> Path:
        path = self.work_path / "engines" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def relative(self, path: Path) -> Path:
        return path.relative_to(self.work_path)

    def finish(self, manifest: dict, complete: bool) -> Path:
        (self.work_path / RUN_FILE).write_text(
            json.dumps(manifest, indent=2) + "\n", encoding="utf-8"
        )
        if not complete:
            return self.work_path
        swap_in(self.work_path, self.final_path, replace=False)  # create() found none
        return self.final_path


def is_complete(path: Path) -> bool:
    run_file = path / RUN_FILE
    if path.name.endswith(INCOMPLETE_SUFFIX) or not run_file.is_file():
        return False
    return json.loads(run_file.read_text(encoding="utf-8")).get("status") == "ok"


def default_path(gate_id: str) -> Path:
    """``runs/<UTC time>-<gate_id>`` under the current folder."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return Path("runs") / f"{stamp}-{gate_id}"
