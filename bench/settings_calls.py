"""Benchmark-only settings for bench_calls: the benchmark settings plus the bare comparison view's URL."""

from bench.settings import *  # noqa: F403

ROOT_URLCONF = "bench.bare"
