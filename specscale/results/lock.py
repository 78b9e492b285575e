"""A per-cell lock, so concurrent sweeps on one results store never run a cell twice.

The lock is a file (``.lock`` in the cell directory) created with O_CREAT|O_EXCL, which
is atomic on local file systems and on NFSv3+ alike (``flock`` is not reliable on every
cluster file system). It holds the owner (host, PID, a random token, start time); a
thread refreshes its mtime (the heartbeat) while the cell runs. A lock is stale, and is
taken over, when its owner is on this host and its PID is gone (SIGKILL, OOM kill), or
when its heartbeat is older than ``stale_after_s`` (an owner on another node that died,
or a node that went away).

Taking a stale lock over is serialized by a second O_EXCL file, the takeover guard
(``.lock.takeover``): two sweeps that both judge the lock stale would otherwise both
remove it, and the second removal could hit the lock the first had just created. The
guard holder re-reads the lock and removes it only if it still holds the stale owner's
token. A guard is held for milliseconds; one whose holder died is itself stale after
``GUARD_STALE_S`` (or at once when its PID is gone on this host).
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

LOCK_NAME = ".lock"
HEARTBEAT_S = 30.0
# Several missed heartbeats (a node under load can stall for a while) before another
# sweep may take the cell over.
STALE_AFTER_S = 300.0
GUARD_NAME = ".lock.takeover"
GUARD_STALE_S = 30.0
RETRY_S = 0.02  # wait while another process holds the takeover guard


class CellBusy(RuntimeError):
    """Another live process holds the cell's lock."""

    def __init__(self, path: Path, owner: dict) -> None:
        super().__init__(f"{path.parent} is being run by {owner.get('host')} pid {owner.get('pid')}")
        self.owner = owner


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def read_owner(path: Path) -> Optional[dict]:
    """The lock's owner record; {} when unreadable (being written); None when absent."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return {}


def is_stale(path: Path, owner: dict, stale_after_s: float = STALE_AFTER_S) -> bool:
    try:
        age = time.time() - Path(path).stat().st_mtime
    except FileNotFoundError:
        return True
    if owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int):
        if not _pid_alive(owner["pid"]):
            return True
    return age > stale_after_s


@dataclass
class CellLock:
    """Exclusive ownership of one cell directory; use as a context manager or acquire/release."""

    directory: Path
    heartbeat_s: float = HEARTBEAT_S
    stale_after_s: float = STALE_AFTER_S
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    took_over: Optional[dict] = None  # the stale owner replaced, if any
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: Optional[threading.Thread] = field(default=None, repr=False)

    @property
    def path(self) -> Path:
        return Path(self.directory) / LOCK_NAME

    def acquire(self) -> "CellLock":
        """Take the lock or raise CellBusy; a stale lock is taken over."""
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        for _ in range(50):
            if _create_exclusive(self.path, self._record()):
                self._start_heartbeat()
                return self
            owner = read_owner(self.path)
            if owner is None:  # released in between: try again
                continue
            # An empty record is a lock being written (or whose writer died right after
            # creating it): only its age can tell.
            if not is_stale(self.path, owner, self.stale_after_s):
                raise CellBusy(self.path, owner)
            if not self._take_over(owner):
                time.sleep(RETRY_S)  # another process is taking it over: see what it leaves
        raise CellBusy(self.path, read_owner(self.path) or {})

    def _record(self) -> dict:
        return {"host": socket.gethostname(), "pid": os.getpid(), "token": self.token, "started": time.time()}

    def _take_over(self, owner: dict) -> bool:
        """Remove the lock judged stale (``owner``), holding the takeover guard; False when
        another process holds the guard (it is taking the lock over)."""
        guard = self.path.with_name(GUARD_NAME)
        if not _create_exclusive(guard, self._record()):
            held_by = read_owner(guard)
            if held_by is not None and is_stale(guard, held_by, GUARD_STALE_S):
                _remove_if_token(guard, held_by.get("token"), self.token)  # its holder died mid-takeover
            return False
        try:
            current = read_owner(self.path)
            # Still the same stale lock? It may have been released, or taken over by a
            # process that held the guard before us: then the loop looks again.
            if current is not None and current.get("token") == owner.get("token") and is_stale(
                    self.path, current, self.stale_after_s):
                if _remove_if_token(self.path, owner.get("token"), self.token):
                    self.took_over = owner
        finally:
            _remove_if_token(guard, self.token, self.token)
        return True

    def _start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(self.heartbeat_s):
                try:
                    os.utime(self.path)
                except FileNotFoundError:  # released, or set aside for an instant by a taker
                    continue

        self._thread = threading.Thread(target=beat, name="cell-lock-heartbeat", daemon=True)
        self._thread.start()

    def owns(self) -> bool:
        owner = read_owner(self.path)
        return bool(owner) and owner.get("token") == self.token

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.owns():
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> "CellLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _create_exclusive(path: Path, record: dict) -> bool:
    """Create ``path`` holding ``record``, atomically; False if it exists."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        json.dump(record, fh)
    return True


def _remove_if_token(path: Path, token: Optional[str], mine: str) -> bool:
    """Remove ``path`` if it holds ``token``. Rename first (atomic, one remover wins), then
    check what was moved: a file that changed in between (another owner's) is put back."""
    aside = path.with_name(f"{path.name}.aside-{mine}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    moved = read_owner(aside)
    if moved is not None and moved.get("token") != token:
        try:
            os.link(aside, path)  # fails if yet another owner exists: theirs stands
        except FileExistsError:
            pass
        aside.unlink(missing_ok=True)
        return False
    aside.unlink(missing_ok=True)
    return True
