"""The outbound HTTP door: the SSRF guard, the pinned transport and the client factory every fetch goes through."""

from .client import Outbound
from .guard import AllowList, Guard, SsrfBlocked

__all__ = ["AllowList", "Guard", "Outbound", "SsrfBlocked"]
