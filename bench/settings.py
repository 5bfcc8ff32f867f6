"""Benchmark settings: the real settings with a data directory of the benchmarks' own."""

import os
from pathlib import Path

os.environ.setdefault("ALEPH_DATA_DIR", str(Path(__file__).resolve().parent.parent / "var" / "bench"))

from aleph_site.settings import *  # noqa: F403
