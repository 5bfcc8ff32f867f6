"""Runs every bench/bench_*.py in its own process; each prints a markdown section against a same-run baseline."""

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(selected: list[str]) -> int:
    scripts = sorted((ROOT / "bench").glob("bench_*.py"))
    if selected:
        scripts = [s for s in scripts if any(name in s.stem for name in selected)]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "bench.settings")}
    env.setdefault("ALEPH_DATA_DIR", str(ROOT / "var" / "bench"))
    failures = 0
    for script in scripts:
        started = time.monotonic()
        print(f"\n<!-- {script.name} -->", flush=True)
        result = subprocess.run([sys.executable, "-m", f"bench.{script.stem}"], cwd=ROOT, env=env)
        print(f"<!-- {script.name}: exit {result.returncode} in {time.monotonic() - started:.1f}s -->", flush=True)
        failures += result.returncode != 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
