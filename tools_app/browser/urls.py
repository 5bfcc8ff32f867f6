from django.urls import path

from . import views

app_name = "browser"

urlpatterns = [
    path("artifacts/<uuid:call_id>/", views.artifact, name="artifact"),
]
