"""Collects each app's websocket routes; the apps own them."""

from approvals_app.routing import websocket_urlpatterns as approvals_routes

websocket_urlpatterns: list = [*approvals_routes]
