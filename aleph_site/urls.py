from django.contrib import admin
from django.urls import include, path

from tools_app import pages

urlpatterns = [
    path("", pages.dashboard, name="dashboard"),
    path("login/", pages.LoginView.as_view(), name="login"),
    path("logout/", pages.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("tools_app.api.urls")),
    path("mcp/servers/", include("tools_app.mcp.urls")),
    path("api/v1/approvals/", include("approvals_app.api_urls")),
    path("approvals/", include("approvals_app.urls")),
    path("api/v1/ledger/", include("ledger_app.api_urls")),
    path("ledger/", include("ledger_app.urls")),
    path("browser/", include("tools_app.browser.urls")),
]

handler404 = "tools_app.pages.not_found"
handler500 = "tools_app.pages.server_error"
