"""Services for people, agents, tokens and sessions: keyword-only, named <noun>_<verb>."""

from __future__ import annotations

import hashlib
import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import transaction

from .models import Agent, ExecTier, PersonToken, Session
from .signals import agent_created

ROLES = ("admin", "operator", "auditor")


class ApplicationError(Exception):
    """A refusal a person or an agent can act on; mapped once to a JSON error."""

    def __init__(self, message: str, *, code: str = "invalid", status: int = 400, detail: dict | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.detail = detail or {}


def token_new(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(32)}"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@transaction.atomic
def agent_create(*, name: str, exec_tier: str | None = None, parent: str | None = None) -> tuple[Agent, str]:
    """Create an agent; its token is returned once and stored only as a hash."""
    if exec_tier is not None and exec_tier not in ExecTier.values:
        raise ApplicationError(f"exec tier must be one of {', '.join(ExecTier.values)}", code="invalid_tier")
    parent_agent = None
    if parent:
        parent_agent = Agent.objects.filter(name=parent).first()
        if parent_agent is None:
            raise ApplicationError(f"no agent named {parent!r} to be the parent", code="unknown_parent")
    if Agent.objects.filter(name=name).exists():
        raise ApplicationError(f"an agent named {name!r} already exists", code="duplicate_agent")
    token = token_new("aleph_agent")
    agent = Agent(name=name, exec_tier=exec_tier, parent=parent_agent, token_hash=token_hash(token))
    try:
        agent.full_clean()
    except ValidationError as exc:
        raise ApplicationError("; ".join(exc.messages), code="invalid_agent") from None
    agent.save()
    agent_created.send(sender=Agent, agent=agent)
    return agent, token


@transaction.atomic
def agent_token_reset(*, agent: Agent) -> str:
    token = token_new("aleph_agent")
    agent.token_hash = token_hash(token)
    agent.save(update_fields=["token_hash"])
    return token


def person_roles(user) -> set[str]:
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return set()
    if user.is_superuser:
        return set(ROLES)
    return {name for name in user.groups.values_list("name", flat=True) if name in ROLES}


@transaction.atomic
def user_create(*, name: str, role: str, password: str | None = None) -> tuple[object, str]:
    """Create a person with one role and a personal API token, returned once."""
    if role not in ROLES:
        raise ApplicationError(f"role must be one of {', '.join(ROLES)}", code="invalid_role")
    User = get_user_model()
    if User.objects.filter(username=name).exists():
        raise ApplicationError(f"a user named {name!r} already exists", code="duplicate_user")
    user = User(username=name, is_staff=role == "admin", is_superuser=role == "admin")
    if password:
        user.set_password(password)
    else:
        user.set_unusable_password()
    user.save()
    if role != "admin":
        group, _ = Group.objects.get_or_create(name=role)
        user.groups.add(group)
    token = token_new("aleph_user")
    PersonToken.objects.create(user=user, token_hash=token_hash(token))
    return user, token


def person_for_token(token: str):
    found = PersonToken.objects.select_related("user").filter(token_hash=token_hash(token)).first()
    if found is None or not found.user.is_active:
        return None
    return found.user


def session_open(*, agent_id: int, key: str) -> Session:
    session, _ = Session.objects.get_or_create(agent_id=agent_id, key=key)
    return session
