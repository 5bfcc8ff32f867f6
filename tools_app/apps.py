from django.apps import AppConfig


class ToolsAppConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "tools_app"
    verbose_name = "Tools and policy"

    def ready(self) -> None:
        from . import signals
        from .api import schema  # noqa: F401  registers the Bearer scheme with drf-spectacular
        from .command_policy import rules_path  # noqa: F401  registers [sandbox] in aleph.toml
        from .mcp import toml  # noqa: F401  registers [[mcp_servers]] in aleph.toml

        signals.connect()
