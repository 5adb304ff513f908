"""The prefix-sharing tree: a trie of the log's prompt pages.

Each full prompt page is a node, identified by the cache core's chained page hash (so
a node stands for the whole prefix up to it, in its namespace); a request is a path
from a root. From it:

- ``roots``: distinct first pages (different namespaces, or prompts differing within
  their first page); ``nodes``: distinct pages, the prompt footprint of an unlimited
  cache; ``sharing_factor``: prompt pages over distinct pages.
- ``branch_points``: nodes with two or more children (where prompts fork).
- ``top_prefixes``: the most valuable shared prefixes. A prefix is reported where a
  run shared by ``requests`` requests ends (no child keeps all of them); its value is
  ``(requests - 1) * tokens``, the prefill a cache saves on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from prefixcache.analyze.records import TokenizedRequest
from prefixcache.analyze.textmap import prompt_context


@dataclass
class SharedPrefix:
    tokens: int
    requests: int
    saved_tokens: int
    example_request: str
    text_end: str = ""  # the text just before the prefix ends

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class TreeSummary:
    block_size: int
    requests: int
    prompt_pages: int
    nodes: int
    roots: int
    leaves: int
    branch_points: int
    max_depth_tokens: int
    mean_depth_tokens: float
    sharing_factor: float
    top_prefixes: list[SharedPrefix] = field(default_factory=list)

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["top_prefixes"] = [p.as_dict() for p in self.top_prefixes]
        return d


def summarize_tree(requests: list[TokenizedRequest], hashes: list[list[bytes]],
                   block_size: int, tokenizer=None, top: int = 10) -> TreeSummary:
    """Summarize the trie of ``hashes`` (each request's prompt page hashes, from a
    replay with ``keep_hashes``)."""
    count: dict[bytes, int] = {}
    children: dict[bytes, set[bytes]] = {}
    depth: dict[bytes, int] = {}
    example: dict[bytes, int] = {}
    roots: set[bytes] = set()
    for k, hs in enumerate(hashes):
        parent = None
        for i, h in enumerate(hs):
            count[h] = count.get(h, 0) + 1
            if h not in depth:
                depth[h] = i + 1
                example[h] = k
            if parent is None:
                roots.add(h)
            else:
                children.setdefault(parent, set()).add(h)
            parent = h
    prompt_pages = sum(len(hs) for hs in hashes)
    nodes = len(count)
    lens = [len(hs) * block_size for hs in hashes]
    ends = []
    for h, c in count.items():
        if c < 2:
            continue
        kids = children.get(h, ())
        if all(count[x] < c for x in kids):
            ends.append(h)
    ends.sort(key=lambda h: (-(count[h] - 1) * depth[h], -depth[h]))
    tops = []
    for h in ends[:top]:
        tokens = depth[h] * block_size
        tr = requests[example[h]]
        text = ""
        if tokenizer is not None:
            _, ctx = prompt_context(tokenizer, tr, tokens, width=60)
            text = ctx.split("⟦")[0]
        tops.append(SharedPrefix(tokens=tokens, requests=count[h],
                                 saved_tokens=(count[h] - 1) * tokens,
                                 example_request=tr.request_id, text_end=text))
    return TreeSummary(
        block_size=block_size, requests=len(hashes), prompt_pages=prompt_pages,
        nodes=nodes, roots=len(roots),
        leaves=sum(1 for h in count if h not in children),
        branch_points=sum(1 for kids in children.values() if len(kids) >= 2),
        max_depth_tokens=max(lens, default=0),
        mean_depth_tokens=sum(lens) / len(lens) if lens else 0.0,
        sharing_factor=prompt_pages / nodes if nodes else 0.0, top_prefixes=tops)
