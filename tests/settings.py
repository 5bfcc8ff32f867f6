"""Test settings: the real settings, with a data directory of the suite's own."""

import os
from pathlib import Path

os.environ.setdefault("ALEPH_DATA_DIR", str(Path(__file__).resolve().parent.parent / "var" / "test"))

from aleph_site.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
