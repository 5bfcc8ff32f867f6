"""Collects each app's websocket routes; the apps own them."""

websocket_urlpatterns: list = []
