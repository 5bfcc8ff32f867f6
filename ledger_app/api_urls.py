from django.urls import path

from . import api

urlpatterns = [
    path("<str:agent>/entries/", api.LedgerEntriesView.as_view(), name="ledger-entries"),
    path("<str:agent>/verify/", api.LedgerVerifyView.as_view(), name="ledger-verify"),
    path("<str:agent>/export/", api.LedgerExportView.as_view(), name="ledger-export"),
]
