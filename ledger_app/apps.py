from django.apps import AppConfig


def _agent_key(sender, agent, **kwargs) -> str:
    """Every agent (and sub-agent) gets its own key and identity entry in the transaction that creates it."""
    from .services import key_create

    key = key_create(agent=agent)
    agent.public_key_b64 = key.public_key
    return key.public_key


class LedgerAppConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "ledger_app"
    verbose_name = "Signed ledger"

    def ready(self) -> None:
        from tools_app.signals import agent_created

        agent_created.connect(_agent_key, dispatch_uid="ledger_agent_key")
