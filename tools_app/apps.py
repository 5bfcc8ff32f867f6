from django.apps import AppConfig


class ToolsAppConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "tools_app"
    verbose_name = "Tools and policy"

    def ready(self) -> None:
        from . import command_policy, signals  # noqa: F401  command_policy registers [sandbox] in aleph.toml
        from .api import schema  # noqa: F401  registers the Bearer scheme with drf-spectacular
        from .mcp import toml  # noqa: F401  registers [[mcp_servers]] in aleph.toml

        signals.connect()
