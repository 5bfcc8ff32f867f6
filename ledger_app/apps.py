from django.apps import AppConfig


class LedgerAppConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "ledger_app"
