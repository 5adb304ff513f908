"""KV tiers below the page pool: the page-group byte format (:mod:`.format`), the tier
interface (:mod:`.base`). Torch-free: bytes in, bytes out. Submodules import siblings
directly; this package re-exports nothing."""
