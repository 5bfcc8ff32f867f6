"""Approval requests and grants in the admin console: read-only, since decisions go through the services."""

from django.contrib import admin

from .models import ApprovalRequest, Grant


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "tool", "agent", "channel", "status", "decided_by", "scope")
    list_filter = ("status", "channel")
    search_fields = ("tool", "agent__name")


@admin.register(Grant)
class GrantAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "tool", "agent", "channel", "scope", "granted_by", "expires_at", "revoked_at", "uses")
    list_filter = ("scope", "channel")
