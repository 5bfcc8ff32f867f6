"""Settings from the environment: a bad value stops start-up naming the variable, and PostgreSQL never falls back."""

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import pytest

from tests.conftest import SERVICES_REQUIRED

BASE_DIR = Path(__file__).resolve().parent.parent
CONFIG_VARIABLES = (
    "DATABASE_URL",
    "REDIS_URL",
    "ALEPH_DEBUG",
    "ALEPH_BIND",
    "ALEPH_SANDBOX_MIN_LEVEL",
    "ALEPH_SECRET_KEY",
    "ALEPH_ALLOWED_HOSTS",
    "DJANGO_SETTINGS_MODULE",
)


def manage(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Run manage.py with the real settings, a fresh data dir and only the variables given."""
    clean = {k: v for k, v in os.environ.items() if k not in CONFIG_VARIABLES}
    clean.update(ALEPH_DATA_DIR=str(tmp_path / "data"), DJANGO_SETTINGS_MODULE="aleph_site.settings", **env)
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=BASE_DIR, env=clean, capture_output=True, text=True, timeout=120
    )


def test_the_defaults_start(tmp_path):
    result = manage(tmp_path, "check")
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


BAD_VALUES = [
    ("ALEPH_DEBUG", "maybe"),
    ("ALEPH_BIND", "nope"),
    ("ALEPH_BIND", "127.0.0.1:99999"),
    ("DATABASE_URL", "mysql://x"),
    ("DATABASE_URL", "postgres://postgres@127.0.0.1:5432"),
    ("ALEPH_SANDBOX_MIN_LEVEL", "bogus"),
    ("REDIS_URL", "http://x"),
    ("ALEPH_SECRET_KEY", "short"),
]


@pytest.mark.parametrize(("variable", "value"), BAD_VALUES)
def test_a_bad_value_stops_start_up_naming_the_variable(tmp_path, variable, value):
    result = manage(tmp_path, "check", **{variable: value})
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert "ImproperlyConfigured" in last_line and variable in last_line, result.stderr[-2000:]
    assert not (tmp_path / "data" / "aleph.sqlite3").exists()


def _postgres_url() -> str:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        if SERVICES_REQUIRED:
            pytest.fail("ALEPH_REQUIRE_SERVICES=1 but DATABASE_URL does not name a PostgreSQL server")
        pytest.skip("DATABASE_URL is not set: no PostgreSQL server to point at a missing database")
    return url


def test_a_postgres_database_that_does_not_exist_fails_loudly(tmp_path):
    parts = urlparse(_postgres_url())
    missing = urlunparse(parts._replace(path="/aleph_no_such_database_4711"))
    result = manage(tmp_path, "migrate", "--noinput", DATABASE_URL=missing)
    assert result.returncode != 0
    assert 'database "aleph_no_such_database_4711" does not exist' in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "data" / "aleph.sqlite3").exists()


def test_an_unreachable_postgres_fails_loudly(tmp_path):
    result = manage(tmp_path, "migrate", "--noinput", DATABASE_URL="postgres://postgres@127.0.0.1:1/aleph")
    assert result.returncode != 0
    assert "OperationalError" in result.stderr and "127.0.0.1" in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "data" / "aleph.sqlite3").exists()


def test_a_good_postgres_url_is_used_not_sqlite(tmp_path):
    url = _postgres_url()
    code = "from django.db import connection; print(connection.vendor, connection.settings_dict['NAME'])"
    result = manage(tmp_path, "shell", "-c", code, DATABASE_URL=url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].split() == ["postgresql", urlparse(url).path.lstrip("/")]
