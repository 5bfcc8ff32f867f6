"""The tree stays clean: ruff check, ruff format --check and makemigrations --check, as CI runs them."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUFF = Path(sys.executable).parent / "ruff"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_ruff_check_is_clean():
    result = run(str(RUFF), "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean():
    result = run(str(RUFF), "format", "--check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_missing_migrations():
    result = run(sys.executable, "manage.py", "makemigrations", "--check", "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
