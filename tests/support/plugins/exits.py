"""A plug-in module that ends the process when imported (as ``unittest.__main__`` does)."""

from __future__ import annotations

import sys

sys.exit(5)
