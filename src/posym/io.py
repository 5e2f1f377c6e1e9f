"""Atomic file writes, output guards, directory locks, YAML/JSON/Parquet helpers and run manifests.

Every file posym writes goes through `atomic_path`: the content is written to a temporary name in
the same directory and renamed into place, so a killed process never leaves a half-written file
visible under the final name. `check_output` refuses, before any work, an output that would replace
a device, a fifo, a directory or one of the command's own inputs; `locked` keeps two processes out of
one output directory; `interruptible` turns Ctrl-C into one line on what was kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import glob
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import reprlib
import shutil
import signal
import stat
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

import yaml

from posym.errors import STOP_SIGNALS, Interrupted, PosymError
from posym.runs import CHECKPOINTS, DONE, RUN_FILES, STAGES, is_model_dir, is_run_dir, is_study_dir

_HOST = platform.node().replace("-", "_") or "host"
_UMASK = os.umask(0)
os.umask(_UMASK)


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporaries of `path` that killed processes of this host left; return them.

    Only names `atomic_path` made on this host whose writer pid no longer runs are touched.
    """
    path = Path(path)
    removed = []
    for leftover in path.parent.glob(f".{glob.escape(path.name)}.tmp-{glob.escape(_HOST)}-*"):
        pid = leftover.name[len(f".{path.name}.tmp-{_HOST}-") :].split("-", 1)[0]
        if not pid.isdigit() or _running(int(pid)):
            continue
        shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(missing_ok=True)
        removed.append(leftover)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """The stop signals (`STOP_SIGNALS`) held back for the body and delivered, to the handlers they had,
    when it ends.

    Python runs signal handlers in the main thread at its next bytecode, whichever thread the OS gave the
    signal to (so a thread's signal mask cannot hold them back): the handlers are swapped for one that
    notes the signal, and the noted signals are raised again afterwards. Elsewhere than in the main thread
    no handler runs, and nothing needs holding."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    before = {s: signal.signal(s, lambda signum, frame: noted.append(signum)) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(noted):
            signal.raise_signal(s)


@contextlib.contextmanager
def atomic_path(
    path: str | os.PathLike, *, is_dir: bool = False, replace: bool = False, owns: tuple[str, ...] = ()
) -> Iterator[Path]:
    """Yield a temporary sibling path; on success rename it to `path` (replacing it).

    On any exception the temporary file or directory is removed and `path` is left untouched. A
    directory `path` that exists and is not empty is replaced only with `replace=True` (the caller owns
    it, as `posym train` owns its checkpoints), and then only if the new directory holds every name the
    old one held (`_refuse_foreign`; entries matching a glob pattern of `owns` may go: the command's own
    files of an earlier run); otherwise it is refused before anything is written, so a directory output
    never deletes what it lands on.
    """
    path = Path(path)
    parent = path.parent
    _refuse_special(path, is_dir)
    _refuse_control(path, done_files=False)
    if is_dir and not replace and _entries(path):
        raise PosymError(
            f"{path} already exists and is not an empty directory; posym replaces no directory it did not write"
        )
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PosymError(f"cannot create directory {parent}: {exc.strerror}") from None
    if not os.access(parent, os.W_OK):
        raise PosymError(f"output directory {parent} is not writable")
    # the writer's host and pid in the name let a later write of the same path tell a temporary that
    # a killed process left behind from one that a live process is still writing
    prefix = f".{path.name}.tmp-{_HOST}-{os.getpid()}-"
    tmp = None
    try:
        # Ctrl-C or SIGTERM is held back while the temporary is created and named here: arriving in between,
        # it would leave a temporary no cleanup knows of; held, it is raised just after, and the cleanup
        # below removes the temporary
        with _signals_held():
            if is_dir:
                tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
            else:  # mkstemp creates the file, so no other writer can take the name between choosing and opening it
                handle, name = tempfile.mkstemp(prefix=prefix, dir=parent)
                os.close(handle)
                tmp = Path(name)
        # mkdtemp makes a directory 0700 and mkstemp a file 0600; a plain mkdir or open() would give the umask's mode
        os.chmod(tmp, (0o777 if is_dir else 0o666) & ~_UMASK)
        yield tmp
        if is_dir:
            _umask_modes(tmp)
        if is_dir and replace and _entries(path):
            _refuse_foreign(path, tmp, owns)
        if is_dir and path.exists():
            # A directory cannot be renamed over a non-empty one: move the old one aside first.
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=parent))
            os.replace(path, old / "x")
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        remove_stale_temporaries(path)
    except BaseException as exc:
        if tmp is not None and tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp is not None and tmp.exists():
            tmp.unlink()
        if isinstance(exc, OSError):
            raise PosymError(f"cannot write {path}: {exc.strerror or exc}") from None
        if type(exc).__name__ == "SafetensorError":  # the safetensors writer's own I/O error (e.g. disk full)
            raise PosymError(f"cannot write {path}: {_first_line(exc)}") from None
        raise


@contextlib.contextmanager
def output_set(path: str | os.PathLike, *, owns: tuple[str, ...]) -> Iterator[Path]:
    """Write a command's several output files as one: yield an empty temporary sibling of directory
    `path`; when the block ends without an error it replaces `path` whole (an earlier set of the
    command's own files, those matching `owns`, goes with it; anything else there is refused, as
    `atomic_path` does). So `path` holds a complete set or the one before it: a kill or a failed write
    mid-way leaves no tables of the new set beside those of the old one (`posym atlas`, `llm-scores`)."""
    with atomic_path(Path(os.path.abspath(path)), is_dir=True, replace=True, owns=owns) as tmp:
        yield tmp


def _refuse_foreign(path: Path, new: Path, owns: tuple[str, ...] = ()) -> None:
    """`replace=True` replaces a directory only by a newer version of itself: every entry of the old `path`
    must be one the `new` directory holds too, so a file someone put there (or a directory of other files
    under the same name) is never deleted with it."""
    foreign = sorted(
        name
        for name in set(_entries(path)) - set(os.listdir(new)) - {LOCK}
        if not any(fnmatch.fnmatchcase(name, p) for p in owns)
    )
    if foreign:
        raise PosymError(
            f"{path} holds {quote(foreign[0])}, which the new {path.name} does not; posym replaces a "
            "directory only by a newer version of itself: move that file away, then run again"
        )


def _umask_modes(directory: Path) -> None:
    """Give what a writer left in `directory` the modes the umask gives: safetensors' writer and
    temporary files make 0600 files, so others could not read a shared checkpoint."""
    for root, dirs, files in os.walk(directory):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o777 & ~_UMASK)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, 0o666 & ~_UMASK)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _kind(mode: int) -> str:
    """What a file mode is, in words."""
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISREG, "regular file"),
    ):
        if test(mode):
            return name
    return "special file"


def _refuse_special(path: Path, is_dir: bool) -> None:
    """An output may replace a regular file (or, for a directory output, a directory), nothing else:
    renaming over /dev/null would turn the device into a file."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # absent (or a dangling link): nothing to replace
        return
    wanted = stat.S_ISDIR(mode) if is_dir else stat.S_ISREG(mode)
    if not wanted:
        raise PosymError(
            f"{path} exists and is a {_kind(mode)}; posym writes "
            f"{'a directory' if is_dir else 'files'} only where none or a "
            f"{'directory' if is_dir else 'regular file'} is"
        )


def _entries(path: Path) -> list[str]:
    """The names in directory `path` (none if it is absent or not a directory), posym's own hidden
    temporaries of a killed writer left out."""
    try:
        names = os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise PosymError(f"cannot read directory {path}: {exc.strerror}") from None
    return sorted(name for name in names if not _TEMPORARY.match(name))


_TEMPORARY = re.compile(r"^\..+\.(tmp|old)-")
"""The names `atomic_path` gives its temporaries (`.NAME.tmp-HOST-PID-*`) and the old directory it moves aside."""


def _control(path: Path, *, done_files: bool = True) -> str | None:
    """Which of posym's own control files `path` names, in words, or None (a done-file only with
    `done_files`: `posym.stages.mark_done` writes them through `atomic_path`)."""
    if path.name == LOCK:
        return "the lock of a directory: replacing it would admit a second process"
    if _TEMPORARY.match(path.name):
        return "the temporary of a write in progress"
    if done_files and path.parent.name == STAGES and path.name.endswith(DONE):
        return "the done-file of a finished stage: a re-run would skip that stage"
    return None


def _refuse_control(path: Path, *, done_files: bool = True) -> None:
    """An output may never be one of posym's own control files (`_control`): a directory's lock, an atomic
    write's temporary, a stage's done-file (`check_output`; the writer refuses the first two)."""
    what = _control(path, done_files=done_files)
    if what is not None:
        raise PosymError(f"{path} is one of posym's own control files ({what}); choose another name")


# ---- outputs never replace inputs ------------------------------------------------------------------


def _overlap(output: Path, is_dir: bool, source: Path) -> Path | None:
    """The part of input `source` that `output` (resolved) would be or lie inside, or None.

    A file input is protected whole. A run directory (config.yaml, checkpoints/) is read through RUN_FILES:
    outputs beside them are fine (the analyses' defaults, RUN/analysis, RUN/lengthgen). Any other input
    directory (a model directory, a theory or llm-bench output) is read as its files: an output may not be
    it, replace or lie inside any of its entries, or be a file directly in it (loaders read every file
    there); a new subdirectory is fine."""
    inside = lambda guarded: output == guarded or guarded in output.parents  # noqa: E731
    if not source.is_dir():
        return source if inside(source) else None
    if is_run_dir(source) and not is_model_dir(source):
        checkpoints = source / CHECKPOINTS
        if checkpoints in output.parents:  # inside one checkpoint: that checkpoint's (model directory) rule
            checkpoint = checkpoints / output.relative_to(checkpoints).parts[0]
            if checkpoint != output and is_model_dir(checkpoint):
                return _overlap(output, is_dir, checkpoint)
        return next((source / name for name in RUN_FILES if inside(source / name)), None)
    # a model directory, or any other input directory (a theory or llm-bench output): read as its files
    if output == source or (output.parent == source and not is_dir):
        return source
    return next((source / e for e in os.listdir(source) if inside(source / e)), None)


def check_output(
    path: str | os.PathLike | None,
    *,
    inputs: Any = (),
    is_dir: bool = False,
    option: str = "--out",
    owns: Any = (),
    marker: str | None = None,
) -> Path | None:
    """Refuse (PosymError, before any work) an output path that exists and is not a regular file (a
    directory for `is_dir`), that is one of posym's control files (a lock, a temporary), or that is or
    lies inside one of `inputs` (None entries are skipped). Model, run and llm-study directories around the
    output count as inputs too: `posym data --out RUN/config.yaml` would break the run, `--out
    STUDY/study.yaml` the study.

    A directory output that exists and is not empty must be the command's own: every entry matches
    one of the glob patterns `owns` (what the command writes there), or the directory holds `marker`
    (the file a resumable command keeps, e.g. pipeline.yaml). With neither, it must be new or empty.
    Returns the path (None for None)."""
    if path is None:
        return None
    path = Path(path)
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError as exc:  # bytes that are not UTF-8 (os.fsdecode's surrogates): Arrow cannot write there
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")[:200]  # the bytes as \xff
        raise PosymError(
            f"{option} {shown} is not UTF-8 text (byte {exc.start + 1} of the name is not); choose a UTF-8 name"
        ) from None
    _refuse_special(path, is_dir)
    _refuse_control(path)
    output = Path(os.path.realpath(path))
    around = [a for a in output.parents if a.is_dir() and (is_model_dir(a) or is_run_dir(a) or is_study_dir(a))]
    given = [Path(os.path.realpath(p)) for p in inputs if p is not None and os.path.lexists(p)]
    for source in [*given, *around]:
        hit = _overlap(output, is_dir, source)
        if hit is not None:
            raise PosymError(
                f"{option} {path} would overwrite {'' if hit == output else 'part of '}an input of this "
                f"command ({hit}); choose another {option}"
            )
    if is_dir:
        _refuse_inputs_inside(path, output, given, owns=owns, marker=marker, option=option)
        names = [name for name in _entries(path) if name != LOCK]
        if names and not (marker is not None and marker in names):
            foreign = [name for name in names if not any(fnmatch.fnmatchcase(name, p) for p in owns)]
            if foreign and marker is not None and not owns:  # a resumable command's directory: its marker says so
                raise PosymError(f"{option} {path} exists, is not empty and holds no {marker}; choose another {option}")
            if foreign and not owns:
                raise PosymError(
                    f"{option} {path} already exists and is not an empty directory (it holds "
                    f"{quote(foreign[0])}); choose a new or empty directory"
                )
            if foreign:
                raise PosymError(
                    f"{option} {path} already holds files this command does not write (first: "
                    f"{quote(foreign[0])}); choose a new or empty directory"
                )
    return path


def _refuse_inputs_inside(path: Path, output: Path, given: list[Path], *, owns, marker, option: str) -> None:
    """Refuse an input that lies inside directory output `output` under a name the command writes there
    (one of `owns`, or `marker`): `posym atlas --kv-table D/full_attention_heads.tsv --out D` would
    replace the user's table with its own."""
    for source in given:
        if output not in source.parents:
            continue
        name = source.relative_to(output).parts[0]
        if name == marker or any(fnmatch.fnmatchcase(name, p) for p in owns):
            raise PosymError(
                f"{option} {path} would overwrite an input of this command ({source}), which it writes as "
                f"{name}; move that file or choose another {option}"
            )


# ---- one process per output directory -----------------------------------------------------------

LOCK = ".posym.lock"
"""Name of the lock file `locked` keeps in an output directory (holder's pid and host)."""


@contextlib.contextmanager
def locked(directory: str | os.PathLike) -> Iterator[Path]:
    """Hold `directory`'s lock while the body runs; a second posym process is refused with one line.

    The lock is an flock on DIRECTORY/.posym.lock, which names the holder's pid: the kernel releases it
    when the holder dies, so a lock file a killed process left behind is stale and simply taken over.
    A directory this call created is removed again if the body leaves it empty (a failed start blocks
    nothing)."""
    directory = Path(directory)
    created = not directory.exists()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PosymError(f"cannot create directory {directory}: {exc.strerror}") from None
    path = directory / LOCK
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # the umask decides, as for every file posym writes
        except OSError as exc:
            _unlock(directory, path, None, created)
            raise PosymError(f"cannot lock {directory}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
            os.close(fd)
            raise PosymError(
                f"{directory} is in use by posym process {holder[0] if holder else '?'}"
                f"{f' on {holder[1]}' if len(holder) > 1 else ''} (lock {path}); wait for it to finish "
                "or stop it, then run again"
            ) from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a file the previous holder unlinked just before we locked it
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {_HOST}\n".encode(), 0)
    except OSError as exc:  # a full disk (ENOSPC) or quota while naming the holder
        _unlock(directory, path, fd, created)
        raise PosymError(f"cannot lock {directory}: {exc.strerror}") from None
    try:
        yield path
    finally:
        _unlock(directory, path, fd, created)


def _unlock(directory: Path, path: Path, fd: int | None, created: bool) -> None:
    """Remove the lock file (only ours, never a file that replaced it), close it, and remove `directory`
    if `locked` created it and it is empty."""
    if fd is not None:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                path.unlink()
        os.close(fd)
    if created:
        with contextlib.suppress(OSError):
            directory.rmdir()  # only if empty


# ---- Ctrl-C --------------------------------------------------------------------------------------


class Signalled(KeyboardInterrupt):
    """A stop signal (`STOP_SIGNALS`), raised where the main thread is (`handle_signals`), so that every `finally`
    runs: temporaries are removed and locks released as after a Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    def __del__(self):
        # freed while posym has not answered it: something swallowed it without a trace (a library's
        # `except BaseException: pass`, a C call that clears any error), and the command would run on
        if _RAISED and _RAISED[0] is not None and _RAISED[0] == id(self) and not _ANSWERED:
            _deliver_again(self.signum, delay=0.5)


def handle_signals() -> None:
    """The one handler for the stop signals (`STOP_SIGNALS`; `posym.cli.main` installs it): each raises
    `Signalled`, so a `kill` (SIGTERM, what job schedulers and `timeout` send first) or a closed terminal
    (SIGHUP) is answered as a Ctrl-C is: one line on what was kept, the lock released, exit 128 + the
    signal (130, 143, 129). A signal that the parent left ignored (`nohup`, a background job's SIGINT)
    stays ignored.

    Only the first signal is raised: a second one (an impatient second Ctrl-C, `kill` then Ctrl-C) arrives
    while posym is already unwinding, and raising it there would cut the cleanup short (a temporary or the
    lock left behind) and replace the command's line with a traceback or a generic one; it is noted and
    the cleanup goes on. A third stops posym at once (os._exit, exit 128 + the first signal) with the
    command-independent line `STOPPED`, for a cleanup that hangs; SIGKILL still ends it any time."""

    def handler(signum, frame):
        _RECEIVED.append(signum)
        if len(_RECEIVED) == 1:
            raise _first(signum)  # no local name: the traceback holds this frame, which would keep it alive
        if len(_RECEIVED) >= 3:
            first = _RECEIVED[0]
            os.write(2, f"posym: {STOP_SIGNALS[first]}: {STOPPED}\n".encode())
            os._exit(128 + first)

    _ANSWERED.clear()
    _RECEIVED.clear()  # a process that runs posym's main again (tests) starts with no signal received
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) in (signal.default_int_handler, signal.SIG_DFL):
            signal.signal(signum, handler)
    if sys.unraisablehook is not _redeliver_swallowed:
        _UNRAISABLE[:] = [sys.unraisablehook]
        sys.unraisablehook = _redeliver_swallowed


def _first(signum: int) -> Signalled:
    """The Signalled of the first signal, its id kept (`Signalled.__del__` tells a swallowed one by it)."""
    exc = Signalled(signum)
    _RAISED[:] = [id(exc)]
    return exc


def _redeliver_swallowed(unraisable) -> None:
    """`sys.unraisablehook` while `handle_signals` is in force: a signal whose handler ran inside a
    finalizer (a `__del__`, a weakref callback: the main thread's next bytecode may be one) raises its
    `Signalled` there, where Python swallows it, and the command would run on as if no signal had come
    (the likely cause of a `posym score` that scored on after a test's SIGTERM: its handler had run, its
    exception was gone). The signal is then delivered again, from another thread 10 ms later, so that the
    main thread raises it at a later bytecode (landing in a finalizer again, it comes back again); it
    counts as the first signal again. Any other unraisable exception goes to the hook that was there
    before."""
    if isinstance(unraisable.exc_value, Signalled) and _RECEIVED:
        _deliver_again(_RECEIVED[0], delay=0.01)
        return
    _UNRAISABLE[0](unraisable)


def _deliver_again(signum: int, delay: float) -> None:
    """Deliver a swallowed first signal again, `delay` seconds later from another thread (the main thread
    must have left the hook or finalizer it is in), as the first signal again; not if posym has answered
    the signal meanwhile (`answered`)."""
    _RAISED[:] = [None]  # the swallowed exception's later finalization is not a second swallowing

    def again():  # not once posym answered, nor while the interpreter shuts down (the main thread has ended)
        # _RECEIVED is cleared only here: until then posym may still answer (Typer returns 130 after freeing
        # the exception) and must find the signal's number in it
        if not _ANSWERED and threading.main_thread().is_alive():
            _RECEIVED.clear()
            os.kill(os.getpid(), signum)

    redeliver = threading.Timer(delay, again)
    redeliver.daemon = True
    redeliver.start()


def answered() -> None:
    """Say that posym is answering a stop signal (its one line, its exit status): from now on a `Signalled`
    freed before it is not redelivered (`posym.cli.main` calls it, Typer may free the exception first)."""
    _ANSWERED.append(True)


_RAISED: list = []
"""id() of the `Signalled` that `handle_signals` raised for the first signal (None once redelivered)."""
_ANSWERED: list = []
"""Non-empty once posym answers a stop signal (`answered`)."""


_UNRAISABLE: list = []
"""The unraisable hook `handle_signals` replaced (one entry)."""


STOPPED = (
    "stopped at once by a third signal, before the cleanup ended: finished outputs are whole; hidden "
    "temporaries (.NAME.tmp-*) left behind are never read and the next write of NAME removes them"
)
"""The line of a third signal (`handle_signals`)."""


_RECEIVED: list[int] = []
"""The signals `handle_signals` received, in order (the first was raised as `Signalled`)."""


def signal_received() -> int | None:
    """The first stop signal `handle_signals` received, or None: an exception other than `Signalled` that
    comes after one is its effect (a C extension's import that the signal cut short answers with its own
    ImportError, the Signalled lost inside it), and is answered as the signal."""
    return _RECEIVED[0] if _RECEIVED else None


def signal_number(exc: BaseException | None = None) -> int:
    """The signal behind a KeyboardInterrupt (or one it caused, as Click's Abort; without one, the first
    signal received), SIGINT by default."""
    while exc is not None:
        if isinstance(exc, Signalled):
            return exc.signum
        exc = exc.__cause__ or exc.__context__
    return _RECEIVED[0] if _RECEIVED else int(signal.SIGINT)


@contextlib.contextmanager
def interruptible(kept: Any) -> Iterator[None]:
    """Turn a KeyboardInterrupt (Ctrl-C, or SIGTERM / SIGHUP through `handle_signals`) in the body into
    `Interrupted(kept())`: the CLI prints that one line (what was kept, how re-running continues) and
    exits 130 (143 for SIGTERM, 129 for SIGHUP)."""
    try:
        yield
    except KeyboardInterrupt as exc:
        raise Interrupted(kept(), signum=signal_number(exc)) from None
    except Exception:
        if signal_received() is None:
            raise
        raise Interrupted(kept(), signum=signal_received()) from None  # the signal's effect, not a fault


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` atomically; return the path."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write `obj` as pretty, key-sorted JSON atomically."""
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_yaml(path: str | os.PathLike, obj: Any) -> Path:
    """Write `obj` as YAML (block style, keys in insertion order) atomically."""
    return write_text(path, yaml.safe_dump(obj, sort_keys=False))


def write_parquet(path: str | os.PathLike, frame) -> Path:
    """Write a pandas DataFrame to Parquet atomically."""
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)
    return Path(path)


MAX_DEPTH = 64
"""Deepest nesting of lists and mappings posym reads from any JSON, YAML or GGUF metadata (none of its
inputs needs more than a handful): deeper is one PosymError line, never a RecursionError traceback."""


def _depth(value: Any) -> int:
    """How deeply `value` nests lists/tuples/dicts (0 for a scalar), counted without recursion, each
    container once (YAML aliases share them: a billion laughs is a few dozen nodes) and stopping past
    MAX_DEPTH."""
    if not isinstance(value, (list, tuple, dict)):
        return 0
    deepest, stack, seen = 0, [(value, 0)], set()
    while stack:
        item, depth = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        children = item.values() if isinstance(item, dict) else item
        depth += 1
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        stack.extend((child, depth) for child in children if isinstance(child, (list, tuple, dict)))
    return deepest


def bounded(value: Any, where: str) -> Any:
    """`value` if it nests at most MAX_DEPTH levels, else a PosymError naming `where`."""
    if _depth(value) > MAX_DEPTH:
        raise PosymError(f"{where} nests lists or objects more than {MAX_DEPTH} levels deep")
    return value


def parse_json(text: str | bytes, where: str) -> Any:
    """`json.loads` for every JSON posym reads: nesting bounded (MAX_DEPTH), a RecursionError or a
    JSONDecodeError become one PosymError naming `where`. A raw U+2028 inside a string stays in it
    (JSON allows it; splitting a JSONL file on it would cut the record in two)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise PosymError(f"{where} nests lists or objects more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:  # JSONDecodeError, or an integer beyond Python's digit limit
        raise PosymError(f"{where} is not valid JSON ({getattr(exc, 'msg', None) or quote(str(exc))})") from None
    return bounded(value, where)


def read_text(path: str | os.PathLike) -> str:
    """A UTF-8 text file posym wrote (a table.md, a study.yaml shown as it is); a missing file or one that
    is not UTF-8 text is one PosymError line."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PosymError(f"{path} does not exist") from None
    except UnicodeDecodeError as exc:
        raise PosymError(f"{path} is damaged (not UTF-8 text: byte {exc.start + 1} is not)") from None
    except OSError as exc:
        raise PosymError(f"cannot read {path}: {exc.strerror or exc}") from None


def read_json(path: str | os.PathLike) -> Any:
    """Any JSON file (`parse_json`); a missing file or one that is not UTF-8 is one PosymError line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PosymError(f"{path} does not exist") from None
    except (OSError, UnicodeDecodeError):
        raise PosymError(f"{path} is not valid JSON (not readable UTF-8 text)") from None
    return parse_json(text, str(path))


def read_json_object(path: str | os.PathLike) -> dict:
    """A JSON file that must hold an object; anything else (not JSON, a list, not UTF-8, nested too
    deep) is one PosymError line."""
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, dict):
        raise PosymError(f"{path} must hold a JSON object, not a {type(data).__name__}")
    return data


def read_parquet(path: str | os.PathLike, *, arrow: bool = False, required: tuple[str, ...] = (), **kwargs: Any):
    """`pandas.read_parquet`, a missing or damaged file answered with one PosymError line; every Parquet
    read of posym goes through here (tests/test_lint.py). arrow=True: `pyarrow.parquet.read_table`'s
    Table instead of a DataFrame (list columns stay flat Arrow arrays). `required`: the columns the
    caller reads; a table without one is a PosymError naming it (not a KeyError deep inside)."""
    table = _read_parquet(path, arrow=arrow, **kwargs)
    names = table.column_names if arrow else table.columns
    missing = [c for c in required if c not in names]
    if missing:
        raise PosymError(
            f"{path} lacks the column {quote(missing[0])} that posym reads there; give the table as posym wrote it"
        )
    return table


def _read_parquet(path: str | os.PathLike, *, arrow: bool = False, **kwargs: Any):
    path = Path(path)
    if not path.is_file():
        raise PosymError(f"{path} does not exist")
    try:
        if arrow:
            import pyarrow.parquet as pq

            return pq.read_table(path, **kwargs)
        import pandas as pd

        return pd.read_parquet(path, **kwargs)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise PosymError(f"{path} is damaged (not a whole Parquet file: {_first_line(exc)})") from None


def quote(value: Any) -> str:
    """A bounded repr for error messages: a huge (or billion-laughs) value never builds a huge message.
    A path is shown as the user typed it, in quotes (no `PosixPath(...)`).

    >>> quote(Path("/no/such.tsv")), quote("abc")
    ("'/no/such.tsv'", "'abc'")
    """
    text = _QUOTE.repr(str(value) if isinstance(value, os.PathLike) else value)
    return text if len(text) <= 200 else text[:200] + "..."


_QUOTE = reprlib.Repr()
_QUOTE.maxlevel, _QUOTE.maxdict, _QUOTE.maxlist, _QUOTE.maxtuple = 3, 6, 6, 6
_QUOTE.maxstring, _QUOTE.maxother, _QUOTE.maxlong = 80, 80, 40


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (the YAML spec forbids it; PyYAML
    would silently keep the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            if key_node.value in seen:
                line = key_node.start_mark.line + 1
                raise PosymError(f"key {quote(key_node.value)} appears twice in one mapping (line {line})")
            seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | os.PathLike) -> dict:
    """Read a YAML mapping; a missing file, a key given twice or non-mapping content is a `PosymError`."""
    path = Path(path)
    if not path.is_file():
        raise PosymError(f"config file {path} does not exist")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)
    except RecursionError:
        raise PosymError(f"config file {path} nests lists or mappings more than {MAX_DEPTH} levels deep") from None
    except UnicodeDecodeError:
        raise PosymError(f"config file {path} is not UTF-8 text") from None
    except PosymError as exc:
        raise PosymError(f"config file {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise PosymError(f"config file {path} is not valid YAML: {' '.join(str(exc).split())[:300]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PosymError(f"config file {path} must hold a mapping of keys to values")
    return bounded(data, f"config file {path}")


def config_hash(obj: Any) -> str:
    """Stable short hash of a JSON-able object (key order does not matter)."""
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks (assembled models, dequantized copies' names)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def package_version() -> str:
    """posym's version, from the installed distribution's metadata (pyproject.toml is its one source): io.py sits
    below the package's __init__ and imports nothing of posym but its errors."""
    try:
        return importlib.metadata.version("posym-rope")
    except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path without `pip install -e .`
        return "0+unknown"


def versions() -> dict[str, str]:
    """Versions of Python, posym and the libraries whose behaviour changes numbers."""
    import numpy
    import torch
    import transformers

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "posym": package_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
    }


def manifest(config: dict, *, seed: int | None = None, **extra: Any) -> dict:
    """What to store next to every result: config hash, seed and versions."""
    return {"config_hash": config_hash(config), "seed": seed, "versions": versions(), **extra}


# ---- layer x KV-head tables (DuoAttention's full_attention_heads.tsv) ----------------------------


KV_TABLE_BYTES = 1 << 24
"""The largest layer x KV-head table `read_kv_table` reads (16 MB: far past any model's heads)."""


def read_kv_table(path: str | os.PathLike):
    """A layer x KV-head table of numbers (one line per layer, values separated by tabs, commas or
    spaces; DuoAttention's full_attention_heads.tsv and `posym atlas`'s own export) as a float64 numpy
    array [layers, kv_heads]; 0/1 masks and true/false are read as numbers too."""
    import numpy as np

    path = Path(path)
    if not path.is_file():
        raise PosymError(f"{quote(path)} is not a file")
    if path.stat().st_size > KV_TABLE_BYTES:
        raise PosymError(f"{quote(path)} is larger than {KV_TABLE_BYTES:,} bytes: not a layer x KV-head table")
    words = {"true": 1.0, "false": 0.0}
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        cells = [c for c in re.split(r"[\t, ]+", line.strip()) if c]
        if not cells:
            continue
        try:
            rows.append([words[c.lower()] if c.lower() in words else float(c) for c in cells])
        except ValueError:
            raise PosymError(
                f"{quote(path)} line {number} holds a value that is not a number: {line.strip()[:60]!r}"
            ) from None
    if not rows:
        raise PosymError(f"{quote(path)} holds no table")
    if len({len(r) for r in rows}) != 1:
        raise PosymError(
            f"{quote(path)} has lines of different lengths; a layer x KV-head table has one value per KV head"
        )
    grid = np.array(rows, dtype=np.float64)  # [layers, kv_heads]
    if not np.isfinite(grid).all():
        raise PosymError(f"{quote(path)} holds NaN or infinite values")
    return grid


def format_grid(grid, *, as_bool: bool = False) -> str:
    """A layer x KV-head grid as tab-separated lines (DuoAttention's full_attention_heads.tsv: no header)."""
    lines = ["\t".join(str(int(v)) if as_bool else repr(float(v)) for v in row) for row in grid]
    return "\n".join(lines) + "\n"
