"""Compiled CPU kernels of the paged model (built once per machine, on first use)."""
