"""L3: page groups on local disk, one file per group, persistent across restarts.

DESIGN: "Publish-after-write in every tier" and "read back only after header, length and
checksum verify". A store writes ``<name>.kvpg.tmp``, fsyncs and renames it (see
:class:`~prefixcache.cache.tiers.tier_io.TierIO`); only then are its pages indexed. At start
the index is rebuilt from the headers of the files in the directory (leftover temporary files
of a killed process are removed), so a restart, even after ``kill -9``, hits, and a page
already on disk is never rewritten. Files under another model fingerprint are left alone and
never indexed; so is anything that is not a regular file (a directory, FIFO, socket or
device, and any symlink, which is not followed: none of them is ours, so none is opened or
removed; a warning names how many were skipped). A budget above the free space of the
directory's filesystem is allowed, with one warning. The byte budget evicts whole files,
least recently used first, never one holding a page of the group being stored; files
holding a pinned page (TTL pins demoted from the pool, :mod:`.tier_pins`) go only after
every other file, within their byte cap (pins live in memory: after a restart no file is
pinned). A read that fails verification
is a miss: the file is removed and counted. Verification covers the header's claims too: a
valid file that holds other pages than the index has for its name (a file copied over
another, a restored backup), another page layout or other token ids fails like a flipped
byte.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from prefixcache.cache.tiers.base import TierStats
from prefixcache.cache.tiers.format import (
    PREFIX_BYTES,
    CorruptEntry,
    PageGroup,
    PageLayout,
    check_pages,
    decode,
    encode,
    header_length,
    read_header,
)
from prefixcache.cache.tiers.tier_io import TMP_SUFFIX, NotRegularFile, TierIO
from prefixcache.cache.tiers.tier_pins import TierPins

SUFFIX = ".kvpg"

log = logging.getLogger(__name__)


def _writable_dir(path: Path) -> Path:
    """``path``, created if missing; ValueError naming ``disk_cache_dir`` when it (or a
    parent) is not a directory, or it cannot be created or written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"disk_cache_dir: {str(path)!r} is not a directory") from None
    except PermissionError as exc:
        raise ValueError(f"disk_cache_dir: {str(path)!r} cannot be created: "
                         f"{exc.strerror}") from None
    if not path.is_dir():
        raise ValueError(f"disk_cache_dir: {str(path)!r} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"disk_cache_dir: {str(path)!r} is not writable")
    return path


class DiskTier:
    """Disk tier in one directory.

    Args:
        directory: created if missing.
        capacity_bytes: file byte budget (>= 1).
        fingerprint: the running model's fingerprint; only its files are indexed and read.
        io: the file operations (tests pass a :class:`~.tier_io.FaultyIO`).
        max_pinned_fraction: share of the budget files holding pinned pages may use.
        layout: the running model's page layout; a file in another one fails its read
            (``None``: not checked).

    Raises:
        ValueError: ``capacity_bytes < 1``, an empty ``fingerprint``,
            ``max_pinned_fraction`` outside ``[0, 1]``, or ``directory`` not a writable
            directory (the message names ``disk_cache_dir``, the engine's field).
        OSError: ``directory`` cannot be created for another reason."""

    name = "disk"

    def __init__(self, directory: str | Path, capacity_bytes: int, fingerprint: bytes,
                 io: TierIO | None = None, max_pinned_fraction: float = 0.0,
                 layout: PageLayout | None = None):
        if capacity_bytes < 1:
            raise ValueError(f"capacity_bytes must be >= 1, got {capacity_bytes}")
        if not fingerprint:
            raise ValueError("fingerprint must be non-empty")
        self.directory = _writable_dir(Path(directory))
        self.capacity_bytes = capacity_bytes
        self.fingerprint, self.layout = fingerprint, layout
        self.io = io or TierIO()
        self.pins = TierPins(capacity_bytes, max_pinned_fraction)  # keyed by file name
        self._lock = threading.Lock()
        self._files: OrderedDict[str, tuple[tuple[bytes, ...], int]] = OrderedDict()
        self._where: dict[bytes, str] = {}
        self._used = 0
        self._stats = TierStats()
        self.skipped_entries = 0  # names of ours at start that are not regular files
        self.rebuilt_files = self._rebuild()
        self._warn_if_over_free_space()

    def _warn_if_over_free_space(self) -> None:
        try:
            free = shutil.disk_usage(self.directory).free
        except OSError:
            return
        if self.capacity_bytes > self._used + free:
            log.warning("disk tier budget %.2f GiB is more than the free space of %s "
                        "(%.2f GiB free); stores will fail when it fills",
                        self.capacity_bytes / (1 << 30), self.directory, free / (1 << 30))

    def _rebuild(self) -> int:
        found = []
        for path in self.directory.iterdir():
            ours = path.name.endswith(TMP_SUFFIX) or path.name.endswith(SUFFIX)
            if not ours:
                continue
            try:
                st = os.lstat(path)  # never follows a symlink
            except OSError:
                continue  # gone meanwhile
            if not stat.S_ISREG(st.st_mode):
                self.skipped_entries += 1  # not ours: neither opened nor removed
                continue
            if path.name.endswith(TMP_SUFFIX):
                self.io.remove(path)  # an unfinished store of a killed process
                continue
            try:
                head = self.io.read(path, PREFIX_BYTES)
                h = read_header(self.io.read(path, header_length(head)))
                size = st.st_size
            except NotRegularFile:
                self.skipped_entries += 1  # replaced since the lstat
                continue
            except (OSError, CorruptEntry):
                self.io.remove(path)
                self._stats.corrupt += 1
                continue
            if h.fingerprint != self.fingerprint:
                continue
            if size != h.total_len:
                self.io.remove(path)
                self._stats.corrupt += 1
                continue
            found.append((st.st_mtime_ns, path.name, h.hashes, size))
        if self.skipped_entries:
            log.warning("disk tier %s: skipped %d entries that are not regular files",
                        self.directory, self.skipped_entries)
        for _, name, hashes, size in sorted(found):  # oldest first: the LRU order
            self._index(name, hashes, size)
        return len(found)

    def _index(self, name: str, hashes: tuple[bytes, ...], size: int) -> None:
        self._files[name] = (hashes, size)
        for h in hashes:
            self._where[h] = name
        self._used += size
        if self.pins.any_wanted(hashes):
            self.pins.admit(name, size)

    def _unindex(self, name: str, evicted: bool = False) -> None:
        self.pins.release(name, evicted)
        hashes, size = self._files.pop(name)
        for h in hashes:
            if self._where.get(h) == name:
                del self._where[h]
        self._used -= size

    def lookup_run(self, hashes: Sequence[bytes]) -> int:
        with self._lock:
            n = 0
            for h in hashes:
                if h not in self._where:
                    break
                n += 1
            return n

    def contains(self, page_hash: bytes) -> bool:
        with self._lock:
            return page_hash in self._where

    def get(self, hashes: Sequence[bytes],
            token_ids: Sequence[Sequence[int]] | None = None) -> PageGroup | None:
        """The leading pages of ``hashes`` whose files verify (see :meth:`.base.Tier.get`).
        A file is read whole and must hold exactly the pages the index has for it, in the
        running layout, with ``token_ids`` where given; a file that fails is removed and
        counted, and the pages from it on are a miss."""
        with self._lock:
            names: list[str] = []  # the files of the leading pages held
            for h in hashes:
                name = self._where.get(h)
                if name is None:
                    break
                names.append(name)
            if not names:
                self._stats.misses += 1
                return None
            held = {n: self._files[n][0] for n in names}
            for name in held:
                self._files.move_to_end(name)
        want = dict(zip(hashes, token_ids)) if token_ids is not None else None
        groups: dict[str, PageGroup] = {}
        parts: list[tuple[PageGroup, int]] = []
        for name, h in zip(names, hashes):
            if name not in groups:
                g = self._read(name, held[name], want)
                if g is None:
                    break
                groups[name] = g
            parts.append((groups[name], held[name].index(h)))
        with self._lock:
            self._stats.hits += bool(parts)
            self._stats.misses += len(parts) < len(hashes)
        if not parts:
            return None
        first = parts[0][0]
        return PageGroup(self.fingerprint, tuple(hashes[:len(parts)]),
                         tuple(g.token_ids[i] for g, i in parts), first.dtype,
                         first.page_shape, b"".join(g.page_payload(i) for g, i in parts))

    def _read(self, name: str, hashes: tuple[bytes, ...],
              want: dict[bytes, Sequence[int]] | None) -> PageGroup | None:
        """File ``name``, verified to hold ``hashes`` (its index entry); ``None`` when it
        fails (the file is removed and counted)."""
        path = self.directory / name
        try:
            data = self.io.read(path)
            g = decode(data, self.fingerprint)
            check_pages(g, hashes, self.layout, want)
        except (OSError, CorruptEntry) as e:
            with self._lock:
                if name in self._files:
                    self._unindex(name)
                self._stats.corrupt += isinstance(e, CorruptEntry)
                self._stats.failures += isinstance(e, OSError)
            self.io.remove(path)
            return None
        with self._lock:
            self._stats.loads += 1
            self._stats.load_bytes += len(data)
        return g

    def put(self, group: PageGroup) -> bool:
        with self._lock:
            new = [h for h in group.hashes if h not in self._where]
        if not new:
            with self._lock:
                self._stats.skipped += 1
            return True
        sub = group if len(new) == group.num_pages else group.select(new)
        data = encode(sub)
        if len(data) > self.capacity_bytes:
            with self._lock:
                self._stats.rejected += 1
            return False
        name = hashlib.blake2b(b"".join(sub.hashes), digest_size=16).hexdigest() + SUFFIX
        victims = self._make_room(len(data), set(group.hashes))
        for v in victims:
            self.io.remove(self.directory / v)
        try:
            self.io.write_atomic(self.directory / name, data)
        except Exception:
            with self._lock:
                self._stats.failures += 1
            return False
        with self._lock:
            if name in self._files:
                self._unindex(name)
            self._index(name, sub.hashes, len(data))
            self._stats.stores += 1
            self._stats.store_bytes += len(data)
        return True

    def _make_room(self, need: int, protect: set[bytes]) -> list[str]:
        """Unindex least recently used files until ``need`` more bytes fit: unpinned
        files first, then pinned ones; files holding a page of ``protect`` stay. Returns
        the names to delete."""
        out: list[str] = []
        with self._lock:
            for pinned in (False, True):
                for name in list(self._files):
                    if self._used + need <= self.capacity_bytes:
                        return out
                    hashes, _ = self._files[name]
                    if (name in self.pins) != pinned or protect.intersection(hashes):
                        continue
                    self._unindex(name, evicted=True)
                    self._stats.evictions += len(hashes)
                    out.append(name)
        return out

    def set_pinned(self, hashes: Sequence[bytes], pinned: bool) -> None:
        """Mark page hashes pinned (held now or stored later) or no longer pinned; a file
        is pinned while any of its pages is."""
        with self._lock:
            self.pins.want(hashes, pinned)
            for name in {self._where[h] for h in hashes if h in self._where}:
                file_hashes, size = self._files[name]
                if pinned:
                    self.pins.admit(name, size)
                elif not self.pins.any_wanted(file_hashes):
                    self.pins.release(name)

    def stats(self) -> TierStats:
        with self._lock:
            s = TierStats(**self._stats.as_dict())
            s.pages, s.bytes_used = len(self._where), self._used
            s.pinned_entries, s.pinned_bytes = len(self.pins.entries), self.pins.used
            s.pinned_evictions = self.pins.evictions
            return s

    def close(self) -> None:
        """Nothing to release: every store is complete or removed when it returns."""
