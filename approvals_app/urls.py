from django.urls import path

from . import views

app_name = "approvals"

urlpatterns = [
    path("", views.index, name="index"),
    path("history/", views.history, name="history"),
    path("grants/", views.grants, name="grants"),
    path("grants/<uuid:grant_id>/revoke/", views.grant_revoke_view, name="grant_revoke"),
]
