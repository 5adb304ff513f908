"""The prefix index: page hash -> published page, verified on every hit.

The hash is only a locator. Each entry also keeps the page's full key: its parent (the
chain root's encoded key for page 0, else the entry id of the parent page's entry), its
token ids (as bytes) and its extra keys. A lookup returns a page only if the whole key is
equal, so even a forced hash collision (or a colliding parent chain) cannot serve wrong KV.

Entry ids are unique for the life of the index (never reused), so a child whose parent
was evicted and later recomputed no longer matches: it is unreachable (an *orphan*) and
ages out of the LRU queue like any other cached page, or is superseded by a reachable
entry with the same hash (see ``KVCacheManager.commit``). An entry is reachable exactly
when every entry on its parent chain is still indexed (:meth:`PrefixIndex.reachable`).
"""
from __future__ import annotations

from prefixcache.cache.events import CacheEventLog

ParentRef = bytes | int  # root key (page 0) or the parent's entry id
PageKey = tuple  # (parent_ref, token_bytes, extra_bytes)


class PrefixIndex:
    """Maps page hashes to published pages of a pool of ``num_pages`` pages."""

    def __init__(self, num_pages: int):
        self._by_hash: dict[bytes, int] = {}
        self.page_hash: list[bytes | None] = [None] * num_pages
        self.page_key: list[PageKey | None] = [None] * num_pages
        self.entry_id: list[int] = [0] * num_pages
        self._page_of_entry: dict[int, int] = {}
        self._next_entry = 1
        self.collisions = 0  # lookups whose hash matched but whose key did not
        self.generation = 0  # bumped by every insert and remove (memoised hits check it)
        self.events: CacheEventLog | None = None  # told of every insert and remove

    def __len__(self) -> int:
        return len(self._by_hash)

    def __contains__(self, page_hash: bytes) -> bool:
        return page_hash in self._by_hash

    def get(self, page_hash: bytes) -> int | None:
        """The page indexed under a hash, unverified (``None`` if absent)."""
        return self._by_hash.get(page_hash)

    def lookup(self, page_hash: bytes, key: PageKey) -> int | None:
        """The published page with this hash and exactly this key, else ``None``."""
        page = self._by_hash.get(page_hash)
        if page is None:
            return None
        if self.page_key[page] != key:
            self.collisions += 1
            return None
        return page

    def insert(self, page_hash: bytes, page: int, key: PageKey) -> int:
        """Index a page under a hash the index does not hold yet. Returns its entry id.

        Raises:
            KeyError: the hash is already indexed, or the page already has an entry.
        """
        if page_hash in self._by_hash:
            raise KeyError("hash already indexed")
        if self.page_hash[page] is not None:
            raise KeyError(f"page {page} already indexed")
        self._by_hash[page_hash] = page
        self.page_hash[page] = page_hash
        self.page_key[page] = key
        eid = self._next_entry
        self._next_entry += 1
        self.generation += 1
        self.entry_id[page] = eid
        self._page_of_entry[eid] = page
        if self.events is not None:
            parent = key[0]
            parent_page = None if isinstance(parent, bytes) else self._page_of_entry.get(parent)
            self.events.stored(page_hash, None if parent_page is None
                               else self.page_hash[parent_page], key[1])
        return eid

    def remove(self, page: int) -> bytes | None:
        """Remove a page's entry (eviction, reset). Returns its hash, ``None`` if the
        page was not indexed."""
        h = self.page_hash[page]
        if h is None:
            return None
        del self._by_hash[h]
        self.generation += 1
        del self._page_of_entry[self.entry_id[page]]
        self.page_hash[page] = None
        self.page_key[page] = None
        self.entry_id[page] = 0
        if self.events is not None:
            self.events.removed(h)
        return h

    def page_of_entry(self, entry_id: int) -> int | None:
        """The page holding a live entry, ``None`` once the entry was removed."""
        return self._page_of_entry.get(entry_id)

    def reachable(self, parent: ParentRef | None) -> bool:
        """Whether a key with this parent ref can be found by a lookup walking from its
        chain root: every entry up the parent chain is still indexed. O(chain depth)."""
        while parent is not None and not isinstance(parent, bytes):
            page = self._page_of_entry.get(parent)
            if page is None:
                return False
            parent = self.parent_of(page)
        return parent is not None

    def parent_of(self, page: int) -> ParentRef:
        """The parent ref of an indexed page's key. Raises KeyError if it holds no key."""
        key = self.page_key[page]
        if key is None:
            raise KeyError(f"page {page} holds no indexed key")
        return key[0]

    def indexed_pages(self) -> list[int]:
        return list(self._by_hash.values())
