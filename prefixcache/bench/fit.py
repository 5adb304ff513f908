"""Fit a workload to the model's context, once, so every peer gets the identical requests.

The limit is the model's own context length, ``max_model_len`` (``max_position_embeddings``
of its :class:`~prefixcache.model.config.ModelConfig`), whatever the workload. A request
*fits* when its rendered prompt tokens, plus the special tokens a server adds when it
tokenizes prompt text (``reserve``: a BOS on ``/v1/completions``, see
:func:`special_tokens_added`), plus its ``max_tokens`` are at most ``max_model_len`` (what
every engine admits). The bench renders each request once, fits the workload with the
rule below, and sends the result to every peer.

============================== ============================================================
request                        what happens when it does not fit
============================== ============================================================
single-turn chat request that  **capped**: the system message is cut at its end, the same
opens with a system message    cut for every request of its group (same group, same system
(shared-prefix, cold-burst,    text), so they still share it as a prefix. The cut keeps the
multi-tenant)                  longest opening at which every request of the group fits.
anything else (few-shot and    **skipped**, with every later turn of its session: a later
replay prompts, multi-turn and turn carries the skipped one as history, and a session with
agent sessions)                a turn missing would no longer replay the recorded calls.
============================== ============================================================

A capped request that still does not fit (its own question is too long) is skipped. When
the request opening a (tenant, group) is skipped, the first one kept becomes its cold
request (``warm_expected = False``). Truncating a prompt's start is never done: it would
change the prefix every later request of the group shares.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from prefixcache.bench.prompts import Prompt, Renderer
from prefixcache.bench.workloads import BenchRequest


@dataclass
class FitReport:
    """What fitting did to one workload (recorded in every run's JSON under ``fit``).

    Attributes:
        max_model_len: the limit, tokens (prompt + output).
        reserve: tokens kept free for special tokens a server adds to the prompt.
        built: requests the workload had before fitting.
        capped: requests kept with their system message shortened.
        skipped: requests dropped (with the later turns of their sessions).
    """

    max_model_len: int
    built: int
    reserve: int = 0
    capped: int = 0
    skipped: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """One line for the log, e.g. ``"3 capped (system prompt shortened), 1 skipped, of
        32, to fit the model's 4,096 tokens"``."""
        if not (self.capped or self.skipped):
            return f"all fit {self.max_model_len:,} tokens"
        return (f"{self.capped} capped (system prompt shortened), {self.skipped} skipped, "
                f"of {self.built}, to fit the model's {self.max_model_len:,} tokens")


def fits(req: BenchRequest, prompt: Prompt, max_model_len: int) -> bool:
    return len(prompt.token_ids) + req.max_tokens <= max_model_len


def model_max_len(model: str, model_dir: Path | None) -> int:
    """The model's context length in tokens, by the engine's own rule
    (:attr:`ModelConfig.context_length`: ``max_position_embeddings``, linear RoPE
    scaling, ``model_max_length``), read from the directory for a Hugging Face model and
    from the loaded model otherwise (e.g. ``builtin:tiny``).

    Raises:
        FileNotFoundError / ValueError: from :func:`prefixcache.model.loader.load_model` or
            :meth:`ModelConfig.from_dir` for a model that cannot be read.
    """
    from prefixcache.model.config import ModelConfig

    if model_dir is not None and (model_dir / "config.json").is_file():
        return ModelConfig.from_dir(model_dir).context_length
    from prefixcache.model.loader import load_model

    return load_model(model, device="cpu", dtype="float32").config.context_length


def special_tokens_added(tokenizer) -> int:
    """How many tokens ``tokenizer`` adds to a text when asked for special tokens (a BOS:
    what an OpenAI-compatible server does to a ``/v1/completions`` text prompt); 0 for
    ``None``."""
    if tokenizer is None:
        return 0
    with_special = tokenizer.encode("a", add_special_tokens=True)
    return max(0, len(with_special) - len(tokenizer.encode("a", add_special_tokens=False)))


def fit_workload(reqs: list[BenchRequest], prompts: dict[str, Prompt], renderer: Renderer,
                 max_model_len: int, reserve: int = 0
                 ) -> tuple[list[BenchRequest], dict[str, Prompt], FitReport]:
    """``(requests kept, their prompts, report)`` under the module's rule, keeping
    ``reserve`` tokens free in every request; the input lists are not modified (capped
    requests are copies).

    Raises:
        ValueError: ``max_model_len`` is below 2, or ``reserve`` is negative (the message
            names the parameter).
    """
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
    if reserve < 0:
        raise ValueError(f"reserve must be >= 0, got {reserve}")
    report = FitReport(max_model_len, len(reqs), reserve)
    max_model_len -= reserve  # what the rendered prompt and the output may use
    new_reqs = {r.id: r for r in reqs}
    new_prompts = dict(prompts)
    groups: dict[tuple[str, str], list[BenchRequest]] = {}
    for r in reqs:
        key = _cap_key(r)
        if key is not None and not fits(r, prompts[r.id], max_model_len):
            groups.setdefault(key, [])
    for r in reqs:
        key = _cap_key(r)
        if key is not None and key in groups:
            groups[key].append(r)
    for members in groups.values():
        capped = _cap_group(members, renderer, max_model_len)
        for r, p in capped:
            new_reqs[r.id], new_prompts[r.id] = r, p
    kept, dropped_sessions = [], set()
    for r in reqs:
        r2 = new_reqs[r.id]
        if r.session in dropped_sessions or not fits(r2, new_prompts[r.id], max_model_len):
            dropped_sessions.add(r.session)
            report.skipped += 1
            continue
        kept.append(r2)
    report.capped = sum(1 for r in kept if "capped_system_chars" in r.extra)
    kept = _relabel_cold(reqs, kept)
    return kept, {r.id: new_prompts[r.id] for r in kept}, report


def _cap_key(r: BenchRequest) -> tuple[str, str] | None:
    """``(group, system text)`` of a request the rule caps (a single-turn system + user
    chat request), else ``None``."""
    m = r.messages
    if r.turn != 0 or not m or len(m) != 2 or m[0].get("role") != "system":
        return None
    text = m[0].get("content")
    return (r.group, text) if isinstance(text, str) else None


def _with_system(r: BenchRequest, chars: int) -> BenchRequest:
    """A copy of ``r`` whose system message keeps its first ``chars`` characters."""
    assert r.messages is not None
    system = dict(r.messages[0], content=r.messages[0]["content"][:chars])
    return replace(r, messages=[system] + [dict(m) for m in r.messages[1:]],
                   extra={**r.extra, "capped_system_chars": chars})


def _cap_group(members: list[BenchRequest], renderer: Renderer,
               max_model_len: int) -> list[tuple[BenchRequest, Prompt]]:
    """The group's requests with the longest common system-message opening at which all
    of them fit (found by bisection on characters). Those that do not fit even with an
    empty system message are left out (the caller skips them); when the others then fit
    uncut, nothing is capped (``[]``)."""
    def rendered(chars: int) -> list[tuple[BenchRequest, Prompt]]:
        out = []
        for r in members:
            r2 = _with_system(r, chars)
            out.append((r2, renderer.render(r2)))
        return out

    at_zero = rendered(0)
    members = [r for r, (r2, p) in zip(members, at_zero) if fits(r2, p, max_model_len)]
    if not members:
        return []
    key = _cap_key(members[0])
    assert key is not None
    lo, hi = 0, len(key[1])  # lo fits, hi does not
    if all(fits(r, p, max_model_len) for r, p in rendered(hi)):
        return []
    best = [x for x in at_zero if fits(*x, max_model_len)]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        trial = rendered(mid)
        if all(fits(r, p, max_model_len) for r, p in trial):
            lo, best = mid, trial
        else:
            hi = mid
    return best


def _relabel_cold(before: list[BenchRequest], kept: list[BenchRequest]) -> list[BenchRequest]:
    """``kept``, where the first kept request of a (tenant, group) whose opening request
    was skipped becomes cold (a copy): nothing sent before it carries its prefix."""
    kept_ids = {r.id for r in kept}
    first_of: dict[tuple, BenchRequest] = {}
    for r in before:
        first_of.setdefault((r.tenant, r.group), r)
    seen, out = set(), []
    for r in kept:
        key = (r.tenant, r.group)
        if key not in seen and first_of[key].id not in kept_ids:
            r = replace(r, warm_expected=False)
        seen.add(key)
        out.append(r)
    return out
