"""The navigation bar every page shares: links shown by role, and only for pages that exist."""

from django.urls import NoReverseMatch, reverse

from .services import person_roles

NAVIGATION = (
    ("Dashboard", "dashboard", {"admin", "operator", "auditor"}),
    ("Approvals", "approvals:index", {"admin", "operator"}),
    ("Ledger", "ledger:index", {"admin", "auditor"}),
    ("MCP servers", "mcp:servers", {"admin", "operator"}),
    ("Admin", "admin:index", {"admin"}),
)


def navigation(request) -> dict:
    roles = person_roles(getattr(request, "user", None))
    links = []
    for label, url_name, allowed in NAVIGATION:
        if not roles & allowed:
            continue
        try:
            url = reverse(url_name)
        except NoReverseMatch:
            continue
        links.append(
            {"label": label, "url": url, "active": request.path == url or (url != "/" and request.path.startswith(url))}
        )
    return {"nav_links": links, "roles": sorted(roles)}
