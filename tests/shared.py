"""Where the shared specification and corpora live: beside the checkout (as CI lays them), else /work/shared."""

from pathlib import Path

CANDIDATES = (Path(__file__).resolve().parents[2] / "shared", Path("/work/shared"))


def shared_path(*parts: str) -> Path:
    for root in CANDIDATES:
        path = root.joinpath(*parts)
        if path.exists():
            return path
    raise FileNotFoundError(f"{'/'.join(parts)} is in none of {[str(c) for c in CANDIDATES]}: the corpus is required")
