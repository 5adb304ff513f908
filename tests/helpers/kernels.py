"""The CPU kernels' test fixture body: the kernel module when it built, else a skip (a
failure in CI, where the toolchain is required)."""
from __future__ import annotations

import os
from types import ModuleType

import pytest


def built_or_skip(kernel: ModuleType, name: str) -> ModuleType:
    """``kernel`` (a :mod:`prefixcache.model.cpu.kernels` wrapper with ``load``/``failure``)
    once its library loads; skips without a C++ toolchain, fails when ``CI=true``."""
    if kernel.load() is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the {name} kernel must build in CI: {kernel.failure()}")
        pytest.skip(f"no C++ toolchain here: {kernel.failure()}")
    return kernel
