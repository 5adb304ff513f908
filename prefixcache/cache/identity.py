"""The model's part of every page key: the fingerprint, computed without torch.

DESIGN "one key everywhere": the page hash chain is rooted in (root seed, model
fingerprint, tenant, ``cache_salt``) and that one key is used by the pool, the host-RAM
and disk tiers, the shared store, KV events and the router's index. The fingerprint folds
in the weights' cache id, the KV dtype, the block size and the KV layout version, so a
page written under other weights, another KV dtype or another layout is a miss, never a
load. It lives here, in the torch-free cache core, so that the router (and anything else
that computes page keys: :class:`.page_keys.PromptKeys`) never imports a model.
"""
from __future__ import annotations

from prefixcache.cache.hashing import blake2b_128, encode_parts

# Bump when the KV pool's page layout or its export format changes: every fingerprint,
# hence every page key and every tier entry written before, changes with it.
KV_LAYOUT_VERSION = 1


def kv_dtype_name(dtype: object) -> str:
    """The name a KV dtype has in the fingerprint: ``str(dtype)`` without a ``torch.``
    prefix, so ``torch.bfloat16`` and ``"bfloat16"`` both give ``"bfloat16"`` (torch is
    not imported: a ``torch.dtype`` is only printed)."""
    return str(dtype).removeprefix("torch.")


def model_fingerprint(cache_id: str, kv_dtype: object, block_size: int) -> str:
    """The model's part of every chain root and tier header, e.g.
    ``"builtin:tiny|kv=float32|bs=16|layout=1"``.

    Args:
        cache_id: the weights' identity (``LoadedModel.cache_id``: a path or hub id with
            its revision and weight layout).
        kv_dtype: the KV pool's dtype, a ``torch.dtype`` or its name
            (:func:`kv_dtype_name`).
        block_size: tokens per page.
    """
    return (f"{cache_id}|kv={kv_dtype_name(kv_dtype)}|bs={block_size}"
            f"|layout={KV_LAYOUT_VERSION}")


def tier_fingerprint(fingerprint: str) -> bytes:
    """16 bytes of :func:`model_fingerprint`: what every tier entry's header (host,
    disk) and every shared-store key (Redis) carries, checked when read back."""
    return blake2b_128(encode_parts("kv-fingerprint", fingerprint))
