from django.urls import path

from . import views

app_name = "ledger"

urlpatterns = [
    path("", views.index, name="index"),
    path("<str:agent>/", views.chain, name="chain"),
    path("<str:agent>/verify/", views.verify, name="verify"),
    path("<str:agent>/export/", views.export, name="export"),
    path("<str:agent>/<int:seq>/", views.entry, name="entry"),
]
