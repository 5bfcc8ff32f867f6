from django.urls import path

from . import views

app_name = "mcp"

urlpatterns = [
    path("", views.servers, name="servers"),
]
