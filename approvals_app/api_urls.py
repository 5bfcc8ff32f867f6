from django.urls import path

from . import api

urlpatterns = [
    path("", api.ApprovalListView.as_view(), name="approval-list"),
    path("<uuid:request_id>/", api.ApprovalDetailView.as_view(), name="approval-detail"),
    path("<uuid:request_id>/decide/", api.ApprovalDecideView.as_view(), name="approval-decide"),
]
