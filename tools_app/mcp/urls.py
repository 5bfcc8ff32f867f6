from django.urls import path

from . import views

app_name = "mcp"

urlpatterns = [
    path("", views.servers, name="servers"),
    path("oauth/callback/", views.oauth_callback, name="oauth-callback"),
]
