"""Aleph settings, read from environment variables; a bad value stops start-up."""

import os
import secrets
from pathlib import Path
from urllib.parse import urlparse

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

TIERS = ("ask", "auto", "full")
SANDBOX_LEVELS = ("none", "rlimits", "landlock", "bubblewrap")


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, not {raw!r}")


def env_choice(name: str, choices: tuple[str, ...]) -> str | None:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return None
    if raw not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, not {raw!r}")
    return raw


def env_bind(name: str, default: str) -> tuple[str, int]:
    raw = os.environ.get(name) or default
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ImproperlyConfigured(f"{name} must look like HOST:PORT, not {raw!r}")
    return host.strip("[]"), int(port)


DATA_DIR = Path(os.environ.get("ALEPH_DATA_DIR") or BASE_DIR / "var").resolve()
try:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
except OSError as exc:
    raise ImproperlyConfigured(f"ALEPH_DATA_DIR {str(DATA_DIR)!r} cannot be created: {exc}") from exc


def _secret_key() -> str:
    configured = os.environ.get("ALEPH_SECRET_KEY")
    if configured is not None:
        if len(configured) < 32:
            raise ImproperlyConfigured("ALEPH_SECRET_KEY must be at least 32 characters long")
        return configured
    key_file = DATA_DIR / "secret_key"
    if not key_file.exists():
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(48))
    return key_file.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("ALEPH_DEBUG", False)
BIND_HOST, BIND_PORT = env_bind("ALEPH_BIND", "127.0.0.1:8000")
SANDBOX_MIN_LEVEL = env_choice("ALEPH_SANDBOX_MIN_LEVEL", SANDBOX_LEVELS)
ALLOWED_HOSTS = [h for h in os.environ.get("ALEPH_ALLOWED_HOSTS", "").split(",") if h] or [
    "127.0.0.1",
    "localhost",
    "[::1]",
    "testserver",
    BIND_HOST,
]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "tools_app",
    "ledger_app",
    "approvals_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "aleph_site.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "tools_app.context_processors.navigation",
            ],
        },
    },
]

ASGI_APPLICATION = "aleph_site.asgi.application"
WSGI_APPLICATION = "aleph_site.wsgi.application"


PREPARE_ONLY_WHEN_ASKED = 2**31 - 1


def _database() -> dict:
    url = os.environ.get("DATABASE_URL", "").strip()
    if not url:
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "aleph.sqlite3",
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            "TEST": {"NAME": DATA_DIR / "test-aleph.sqlite3"},
        }
    scheme = urlparse(url).scheme
    if scheme not in ("postgres", "postgresql", "pgsql"):
        raise ImproperlyConfigured(f"DATABASE_URL must be a postgres:// URL, not scheme {scheme!r}")
    try:
        config = dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True)
    except ValueError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL cannot be parsed: {exc}") from exc
    if not config.get("NAME"):
        raise ImproperlyConfigured("DATABASE_URL must name a database, e.g. postgres://user@host:5432/aleph")
    # Django's cursors bind on the client and never prepare; a threshold no statement reaches leaves preparing to
    # code that asks for it by name: the ledger's append, the hottest serialized path (ledger_app/services.py).
    config["OPTIONS"] = {"prepare_threshold": PREPARE_ONLY_WHEN_ASKED}
    return config


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def _channel_layers() -> dict:
    url = os.environ.get("REDIS_URL", "").strip()
    if not url:
        return {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    if urlparse(url).scheme not in ("redis", "rediss", "unix"):
        raise ImproperlyConfigured(f"REDIS_URL must be a redis:// URL, not {url!r}")
    return {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [url]},
        }
    }


REDIS_URL = os.environ.get("REDIS_URL", "").strip() or None
CHANNEL_LAYERS = _channel_layers()

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 8}},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "static"

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tools_app.api.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["tools_app.api.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "EXCEPTION_HANDLER": "tools_app.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Aleph Gateway API",
    "DESCRIPTION": "The tool chokepoint: tools, calls, policy explanations, approvals, ledger and health.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# A request body bigger than this is refused before any parsing (413).
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
ALEPH_MAX_INPUT_BYTES = 256 * 1024

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
ALEPH_GATEWAY_FACTORY = "aleph_site.wiring.build_gateway"
# The browser tools drive this Chromium (empty: they answer "browser not configured"); it stops when idle this long.
ALEPH_BROWSER_EXECUTABLE = os.environ.get("ALEPH_BROWSER_EXECUTABLE", "/usr/bin/chromium").strip()
_browser_idle = os.environ.get("ALEPH_BROWSER_IDLE_S", "").strip() or "300"
if not _browser_idle.replace(".", "", 1).isdigit() or float(_browser_idle) <= 0:
    raise ImproperlyConfigured(f"ALEPH_BROWSER_IDLE_S must be a positive number of seconds, not {_browser_idle!r}")
ALEPH_BROWSER_IDLE_S = float(_browser_idle)
# The channel an MCP client's calls run in when it names none (X-Aleph-Channel header, ?channel=, --channel).
ALEPH_MCP_CHANNEL = os.environ.get("ALEPH_MCP_CHANNEL", "").strip()


def _public_url() -> str:
    host = f"[{BIND_HOST}]" if ":" in BIND_HOST else BIND_HOST
    raw = os.environ.get("ALEPH_PUBLIC_URL", "").strip().rstrip("/") or f"http://{host}:{BIND_PORT}"
    parts = urlparse(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query:
        raise ImproperlyConfigured(f"ALEPH_PUBLIC_URL must look like https://aleph.example.com, not {raw!r}")
    return raw


# Where people's browsers reach this gateway (an MCP server's OAuth login returns there).
ALEPH_PUBLIC_URL = _public_url()
