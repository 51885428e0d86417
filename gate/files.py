"""File names of a run and a report, and how they are written and read.

Everything the gate writes for another process to read is written atomically (a reader never sees
half a file, or half a folder: :func:`staged_folder`), and every report is read through
:func:`read_report_json`, so NaN handling and the ``.incomplete`` fallback are the same for every
command.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from gate.errors import ConfigError

RUN_FILE = "run.json"
REPORT_FILE = "report.json"
REPEAT_FILE = "repeat.json"
ENGINES_DIR = "engines"
INCOMPLETE_SUFFIX = ".incomplete"


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """An exclusive flock on ``path`` while the ``with`` lasts: one process builds a cached thing
    (a venv, a converted model) while the others wait for it. A lock file that exists but is not
    ours to write (an image built by root, run as the user) is only read, since what it guards is
    never rebuilt there."""
    try:
        fh = open(path, "a")  # noqa: SIM115 - closed below, after the lock
    except PermissionError:
        fh = open(path)  # noqa: SIM115
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def atomic_write_bytes(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Call ``write`` on a temporary file beside ``path``, then rename it into place."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, lambda fh: fh.write(text.encode("utf-8")))


# -- folders: stage beside, then swap in ------------------------------------------------------------
#
# A folder another process reads (a baseline, a cached venv's code, an evidence-cache entry, a
# converted model, a vLLM release's source, a finished run) is filled under a hidden name beside its
# target, then swapped in whole. On Linux the swap is renameat2(RENAME_EXCHANGE): one atomic step
# after which the target is the new folder and the staging name holds the old one, which is then
# renamed aside and removed. Where that is unavailable (another OS, a filesystem that refuses it)
# and the target exists, the fallback takes two renames: the target aside, then the staging folder
# in. What a crash leaves, at each point:
#
# - while filling: the target as it was, and a hidden ``.<name>.staging-<pid>-<hex>`` beside it that
#   nothing reads (remove it by hand);
# - after the exchange, before the old folder is removed: the new target, and the old one under the
#   staging name or at ``.<name>.swap-old``;
# - fallback, between its two renames: NO target, the old folder at ``.<name>.swap-old`` and the new
#   one under its staging name. :func:`recover_swap` puts the old folder back; every swap calls it
#   first, and so do the readers of a target that can be replaced (a cached model, a venv's code,
#   an evidence entry, a vLLM source);
# - fallback, after both renames: the new target and the old one at ``.<name>.swap-old``, which
#   :func:`recover_swap` removes.
#
# The target is never half written: it is the old folder or the new one, except in the fallback's
# window, which the next reader or writer closes by restoring the old one.

RENAME_EXCHANGE = 2  # linux/fs.h
AT_FDCWD = -100
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV}


def _renameat2() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2  # glibc >= 2.28
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _renameat2()


def exchange(a: Path, b: Path) -> bool:
    """Swap the paths ``a`` and ``b`` (both exist) in one atomic step; False where the OS or the
    filesystem cannot (then nothing changed)."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _NO_EXCHANGE:
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def swap_aside(target: Path) -> Path:
    """Where a swap keeps ``target``'s old folder until it is removed."""
    return target.with_name(f".{target.name}.swap-old")


def recover_swap(target: Path) -> None:
    """Close what a crash in :func:`swap_in` left: with no target, the folder set aside is the
    old one and goes back; with a target, the one set aside is stale and is removed."""
    target = Path(target)
    aside = swap_aside(target)
    if not os.path.lexists(aside):
        return
    if os.path.lexists(target):
        _remove(aside)
        return
    with contextlib.suppress(FileNotFoundError, FileExistsError, OSError):
        os.rename(aside, target)  # another process may have restored it first


def swap_in(staged: Path, target: Path, *, replace: bool = True, use_exchange: bool = True) -> None:
    """Make the folder ``staged`` the folder ``target`` (beside it, on its filesystem), replacing
    whatever ``target`` holds, and remove the old one. ``replace=False``: only where there is no
    target (one rename; an existing folder with files is an OSError). ``use_exchange=False``
    forces the fallback."""
    staged, target = Path(staged), Path(target)
    if not replace:
        recover_swap(target)
        os.rename(staged, target)
        return
    for _ in range(8):  # another writer may replace the target between two steps: start again
        recover_swap(target)
        if os.path.lexists(target) and use_exchange and exchange(staged, target):
            _remove_old(staged, target)
            return
        try:
            os.rename(staged, target)  # an absent target: one atomic step
            return
        except (FileExistsError, IsADirectoryError, NotADirectoryError):
            pass
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        aside = swap_aside(target)
        try:
            os.rename(target, aside)
        except (FileNotFoundError, FileExistsError):
            continue
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                continue
            raise
        # the fallback's window: no target until the next rename (recover_swap restores the old)
        try:
            os.rename(staged, target)
        except OSError:
            recover_swap(target)
            continue
        _remove(aside)
        return
    raise OSError(errno.EBUSY, f"{target}: replaced by other writers while swapping {staged} in")


def _remove_old(old: Path, target: Path) -> None:
    aside = swap_aside(target)
    with contextlib.suppress(OSError):
        os.rename(old, aside)  # a name recover_swap knows, should the removal be cut short
        old = aside
    _remove(old)


def _remove(path: Path) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


@contextlib.contextmanager
def staged_folder(target: Path, mode: int = 0o777, *, use_exchange: bool = True) -> Iterator[Path]:
    """An empty folder beside ``target`` to fill; when the ``with`` ends normally it becomes
    ``target`` (:func:`swap_in`), replacing the old one. An exception removes it and leaves
    ``target`` as it was; so does removing the staging folder inside the ``with`` (keep the target).
    ``mode`` as for ``os.mkdir`` (the umask applies)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.staging-{os.getpid()}-{secrets.token_hex(4)}")
    os.mkdir(staging, mode)
    try:
        yield staging
        if os.path.lexists(staging):
            swap_in(staging, target, use_exchange=use_exchange)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_json(path: Path, doc: Any) -> None:
    """Indented JSON, atomically; NaN is refused (a report says ``null`` for undefined)."""
    atomic_write_text(path, json.dumps(doc, indent=2, allow_nan=False, default=str) + "\n")


def find_report(path: Path) -> Path:
    """``path`` itself (a report.json), or the report.json of a run directory or its ``.incomplete``.

    A run whose engines failed stays in ``<run>.incomplete/`` and still has a report (verdict ERROR),
    so naming the run directory finds it.
    """
    path = Path(path)
    if path.is_dir():
        candidates = [path / REPORT_FILE]
        if not path.name.endswith(INCOMPLETE_SUFFIX):
            candidates.append(path.with_name(path.name + INCOMPLETE_SUFFIX) / REPORT_FILE)
    else:
        candidates = [path]
        if not path.exists() and not path.name.endswith(".json"):
            candidates.append(path.with_name(path.name + INCOMPLETE_SUFFIX) / REPORT_FILE)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"{path}: no {REPORT_FILE} here (pass a report.json or a gate run directory holding one)"
    )


def read_report_json(path: Path) -> tuple[Any, Path]:
    """The parsed JSON of a report (not yet validated) and the file it came from.

    NaN and Infinity read as ``None``: the schema's "undefined", whoever wrote the file.
    """
    file = find_report(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot read: {exc.__class__.__name__}: {exc}") from None
    try:
        return json.loads(text, parse_constant=lambda _: None), file
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{file}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
