"""``prefixcache analyze``: replay request logs through the cache core, with no model.

From a log (OpenAI-format JSONL, SWE-agent or mini-swe-agent trajectories) it reports
hit rates (overall, per tenant, per turn, per call, unlimited, against block size and
capacity), cache breakers, the prefix-sharing tree, and costs under provider price
sheets (``prices/*.json``). Modules, one concept each:

- :mod:`.records`, :mod:`.usage`: the request shape and normalised provider usage;
- :mod:`.logs`: log readers; :mod:`.render`, :mod:`.encode`: prompts to tokens (the
  tokenizers are :mod:`prefixcache.text`'s);
- :mod:`.replay` (with :mod:`.expiry`), :mod:`.sweep`, :mod:`.capacity`: the cache core
  replay; :mod:`.breakers`, :mod:`.tree`, :mod:`.textmap`: where prompts share and break;
- :mod:`.pricing`, :mod:`.model_rows`, :mod:`.cost`, :mod:`.breakpoints`: price
  sheets, which row prices each request, and cost models;
- :mod:`.validate`: replay against recorded usage;
- :mod:`.analysis` (the whole report), :mod:`.table`, :mod:`.plots`, :mod:`.cli`.

Library use::

    from prefixcache.analyze import AnalyzeOptions, analyze_requests
    from prefixcache.analyze.logs import load_logs
    from prefixcache.text.loading import load_tokenizer
    report = analyze_requests(load_logs(["log.jsonl"]), load_tokenizer("approx"),
                              AnalyzeOptions(block_size=16))
"""
from __future__ import annotations

__all__ = ["AnalyzeOptions", "analyze_requests", "analyze_tokenized"]


def __getattr__(name: str):
    # Lazy, so that ``prefixcache analyze --help`` stays instant.
    if name in __all__:
        from prefixcache.analyze import analysis
        return getattr(analysis, name)
    raise AttributeError(name)
