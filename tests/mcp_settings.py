"""Settings for a process the suite starts (`mcp_serve`): the test settings, on the database the test is using."""

import os

from tests.settings import *  # noqa: F403

DATABASES["default"]["NAME"] = os.environ["ALEPH_TEST_DATABASE"]  # noqa: F405
