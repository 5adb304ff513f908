"""File I/O of the disk tier, behind one small class so tests can inject faults.

DESIGN: "Publish-after-write in every tier": :meth:`TierIO.write_atomic` writes a temporary
name, fsyncs it, renames it over the final name and fsyncs the directory, so a crash (even
``kill -9``) leaves either the whole file or no file under the final name.
:class:`FaultyIO` injects ENOSPC, an exception mid-write, short reads, flipped bytes and
truncation, and counts what it injected (the benchmark compares it with what was detected).
"""
from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path

TMP_SUFFIX = ".tmp"


class NotRegularFile(OSError):
    """A tier path is a directory, FIFO, socket, device or symlink: not a file of ours."""


class TierIO:
    """Plain file operations (the production path)."""

    def write_atomic(self, path: Path, data: bytes) -> None:
        """Write ``data`` to ``path`` via ``path.tmp`` + fsync + rename.

        Raises:
            OSError: the write failed; the temporary file is removed, ``path`` untouched."""
        tmp = path.with_name(path.name + TMP_SUFFIX)
        try:
            with open(tmp, "wb") as f:
                self._write(f, data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._fsync_dir(path.parent)

    def _write(self, f: object, data: bytes) -> None:
        f.write(data)  # type: ignore[attr-defined]

    def read(self, path: Path, size: int = -1) -> bytes:
        """The first ``size`` bytes of ``path`` (all with ``-1``).

        Never follows a symlink and never blocks on a FIFO: it is opened with
        ``O_NOFOLLOW | O_NONBLOCK`` and read only if it is a regular file.

        Raises:
            NotRegularFile: ``path`` is not a regular file.
            OSError: the file is missing or unreadable."""
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise NotRegularFile(exc.errno, f"not a regular file: {path}") from None
            raise
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        except BaseException:
            os.close(fd)
            raise
        if not regular:
            os.close(fd)
            raise NotRegularFile(errno.EINVAL, f"not a regular file: {path}")
        with open(fd, "rb") as f:  # closes fd
            return f.read(size)

    def remove(self, path: Path) -> None:
        """Delete ``path`` if it is a regular file; anything else (a directory, FIFO,
        symlink, ...) is not ours and stays."""
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                return
        except FileNotFoundError:
            return
        path.unlink(missing_ok=True)

    @staticmethod
    def _fsync_dir(d: Path) -> None:
        try:
            fd = os.open(d, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


class FaultyIO(TierIO):
    """:class:`TierIO` with faults armed by tests: each ``arm_*`` call makes the next
    ``count`` matching operations fail in that way. ``injected`` counts by kind."""

    KINDS = ("enospc", "mid_write", "short_read", "flip_byte", "truncate")

    def __init__(self) -> None:
        self._armed = dict.fromkeys(self.KINDS, 0)
        self.injected = dict.fromkeys(self.KINDS, 0)
        self._lock = threading.Lock()

    def arm(self, kind: str, count: int = 1) -> None:
        """Arm ``count`` faults of ``kind`` (one of :attr:`KINDS`).

        Raises:
            ValueError: unknown ``kind`` or ``count < 0``."""
        if kind not in self._armed:
            raise ValueError(f"kind must be one of {self.KINDS}, got {kind!r}")
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        with self._lock:
            self._armed[kind] += count

    def _take(self, kind: str) -> bool:
        with self._lock:
            if self._armed[kind] > 0:
                self._armed[kind] -= 1
                self.injected[kind] += 1
                return True
            return False

    def _write(self, f: object, data: bytes) -> None:
        if self._take("enospc"):
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        if self._take("mid_write"):
            f.write(data[:len(data) // 2])  # type: ignore[attr-defined]
            raise RuntimeError("failure mid-write (injected)")
        f.write(data)  # type: ignore[attr-defined]

    def read(self, path: Path, size: int = -1) -> bytes:
        data = super().read(path, size)
        if size != -1:  # header reads at start are left alone
            return data
        if self._take("short_read"):
            return data[:len(data) - 1 - len(data) // 3]
        if self._take("flip_byte"):
            b = bytearray(data)
            b[len(b) * 2 // 3] ^= 0x40
            return bytes(b)
        if self._take("truncate"):
            with open(path, "r+b") as f:
                f.truncate(len(data) // 2)
            return data[:len(data) // 2]
        return data
