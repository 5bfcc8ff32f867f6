from django.apps import AppConfig


class ApprovalsAppConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "approvals_app"
