"""``python -m prefixcache``: the same command line as ``prefixcache`` (:mod:`.cli`)."""
from __future__ import annotations

import sys

from prefixcache.cli import main

if __name__ == "__main__":
    sys.exit(main())
