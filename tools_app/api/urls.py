from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from . import views

urlpatterns = [
    path("tools/", views.ToolListView.as_view(), name="tool-list"),
    path("tools/schema/", views.ToolSchemaView.as_view(), name="tool-schema"),
    path("tools/<str:name>/", views.ToolDetailView.as_view(), name="tool-detail"),
    path("calls/", views.CallCreateView.as_view(), name="call-create"),
    path("calls/<uuid:call_id>/", views.CallDetailView.as_view(), name="call-detail"),
    path("policy/explain/", views.PolicyExplainView.as_view(), name="policy-explain"),
    path("health/", views.HealthView.as_view(), name="health"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("schema/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="schema-docs"),
]
