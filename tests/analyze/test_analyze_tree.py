from analyze_helpers import tokreq

from prefixcache.analyze.replay import replay
from prefixcache.analyze.tree import summarize_tree

R = list(range(1, 30))


def test_tree_counts():
    reqs = [tokreq("a", R[:8]), tokreq("b", R[:12]), tokreq("c", R[:4] + [50, 51, 52, 53]),
            tokreq("d", R[:4], tenant="x")]
    res = replay(reqs, block_size=4, keep_hashes=True)
    t = summarize_tree(reqs, res.prompt_hashes, 4)
    assert (t.requests, t.prompt_pages, t.nodes, t.roots) == (4, 8, 5, 2)
    assert (t.leaves, t.branch_points, t.max_depth_tokens) == (3, 1, 12)
    assert t.mean_depth_tokens == 8.0 and t.sharing_factor == 8 / 5
    top = [(p.tokens, p.requests, p.saved_tokens) for p in t.top_prefixes]
    assert top == [(8, 2, 8), (4, 3, 8)]
