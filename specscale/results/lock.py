"""A per-cell lock, so concurrent sweeps on one results store never run a cell twice.

The lock is a file (``.lock`` in the cell directory) created with O_CREAT|O_EXCL, which
is atomic on local file systems and on NFSv3+ alike (``flock`` is not reliable on every
cluster file system). It holds the owner (host, PID, a random token, start time); a
thread refreshes its mtime (the heartbeat) while the cell runs. A lock is stale, and is
taken over, when its owner is on this host and its PID is gone (SIGKILL, OOM kill), or
when its heartbeat is older than ``stale_after_s`` (an owner on another node that died,
or a node that went away).
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
        for _ in range(5):
            if self._create():
                self._start_heartbeat()
                return self
            owner = read_owner(self.path)
            if owner is None:  # released in between: try again
                continue
            # An empty record is a lock being written (or whose writer died right after
            # creating it): only its age can tell.
            if not is_stale(self.path, owner, self.stale_after_s):
                raise CellBusy(self.path, owner)
            self._remove_stale(owner)
        raise CellBusy(self.path, read_owner(self.path) or {})

    def _create(self) -> bool:
        record = {"host": socket.gethostname(), "pid": os.getpid(), "token": self.token, "started": time.time()}
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh)
        return True

    def _remove_stale(self, owner: dict) -> None:
        # Rename first (atomic, only one taker wins), then check that what was moved is the
        # lock judged stale: a lock created in between by a live taker is put back.
        aside = self.path.with_name(f"{LOCK_NAME}.stale-{self.token}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        moved = read_owner(aside)
        if moved is not None and moved.get("token") != owner.get("token"):
            try:
                os.link(aside, self.path)  # fails if yet another owner exists: theirs stands
            except FileExistsError:
                pass
        else:
            self.took_over = owner
        aside.unlink(missing_ok=True)

    def _start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(self.heartbeat_s):
                try:
                    os.utime(self.path)
                except FileNotFoundError:
                    return

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
