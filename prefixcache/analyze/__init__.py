"""``prefixcache analyze``: replay request logs through the cache core, with no model.

From a log (OpenAI-format JSONL, SWE-agent or mini-swe-agent trajectories) it reports
hit rates (overall, per tenant, per turn, per call, unlimited, against block size and
capacity), cache breakers, the prefix-sharing tree, and costs under provider price
sheets (``prices/*.json``). Modules, one concept each:

- :mod:`.records`, :mod:`.usage`: the request shape and normalised provider usage;
- :mod:`.logs`: log readers; :mod:`.render`, :mod:`.tokenizer`,
  :mod:`.simple_tokenizers`, :mod:`.encode`: prompts to tokens;
- :mod:`.replay` (with :mod:`.expiry`), :mod:`.sweep`, :mod:`.capacity`: the cache core
  replay; :mod:`.breakers`, :mod:`.tree`, :mod:`.textmap`: where prompts share and break;
- :mod:`.pricing`, :mod:`.cost`, :mod:`.breakpoints`: price sheets and cost models;
- :mod:`.validate`: replay against recorded usage;
- :mod:`.analysis` (the whole report), :mod:`.table`, :mod:`.plots`, :mod:`.cli`.
"""
from prefixcache.analyze.analysis import AnalyzeOptions, analyze_requests, analyze_tokenized

__all__ = ["AnalyzeOptions", "analyze_requests", "analyze_tokenized"]
