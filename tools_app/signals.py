"""Cache invalidation: any saved or deleted piece of policy makes every process recompile on its next call."""

from django.db.models.signals import post_delete, post_save
from django.dispatch import Signal

from .models import Agent, Channel, CommandRule, NetworkAllow, PolicyState, ToolPermission
from .policy_store import policy_touch

# Sent with `agent=` inside the transaction that creates an agent (agent_create, the admin): the ledger gives it a key.
agent_created = Signal()


def _touch(sender, **kwargs) -> None:
    if kwargs.get("raw"):
        return
    policy_touch()


def connect() -> None:
    for model in (Agent, Channel, ToolPermission, PolicyState, NetworkAllow, CommandRule):
        post_save.connect(_touch, sender=model, dispatch_uid=f"policy_touch_save_{model.__name__}")
        post_delete.connect(_touch, sender=model, dispatch_uid=f"policy_touch_delete_{model.__name__}")
