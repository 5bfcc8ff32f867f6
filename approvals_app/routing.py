"""The approvals app's websocket routes, collected by aleph_site.routing."""

from django.urls import path

from .consumers import ApprovalConsumer

websocket_urlpatterns = [path("ws/approvals/", ApprovalConsumer.as_asgi())]
