"""Bearer tokens: an agent's token resolves from the compiled policy, a person's from the database."""

from __future__ import annotations

from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission

from ..chokepoint.policy import AgentInfo, CompiledPolicy
from ..policy_store import current_policy
from ..services import person_for_token, person_roles, token_hash


class AgentPrincipal:
    """request.user for an agent: authenticated, never a person, never staff."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False
    pk = None

    def __init__(self, agent: AgentInfo, policy: CompiledPolicy):
        self.agent = agent
        self.policy = policy
        self.username = f"agent:{agent.name}"

    def __str__(self) -> str:
        return self.username


class BearerTokenAuthentication(BaseAuthentication):
    keyword = b"bearer"

    def authenticate(self, request):
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword:
            return None
        if len(header) != 2:
            raise AuthenticationFailed("Authorization must be 'Bearer <token>'.")
        try:
            token = header[1].decode("ascii")
        except UnicodeDecodeError:
            raise AuthenticationFailed("The token must be ASCII.") from None
        policy = current_policy()
        agent_id = policy.agent_tokens.get(token_hash(token))
        if agent_id is not None:
            return AgentPrincipal(policy.agents[agent_id], policy), None
        user = person_for_token(token)
        if user is not None:
            return user, None
        raise AuthenticationFailed("Unknown or revoked token.")

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="aleph"'


def is_agent(user) -> bool:
    return isinstance(user, AgentPrincipal)


class IsAgent(BasePermission):
    message = "Only an agent's token may do this."

    def has_permission(self, request, view) -> bool:
        return is_agent(request.user)


class HasRole(BasePermission):
    """A person holding one of the view's `roles`; agents never pass."""

    message = "Your role does not allow this."

    def has_permission(self, request, view) -> bool:
        if is_agent(request.user):
            return False
        return bool(person_roles(request.user) & set(view.roles))
