"""The admin console: agents, channels with their permissions, global permissions and the read-only event log."""

from django import forms
from django.contrib import admin, messages

from .models import (
    Agent,
    Channel,
    CommandRule,
    GlobalToolPermission,
    McpServer,
    NetworkAllow,
    PolicyState,
    Scope,
    Session,
    ToolCall,
    ToolPermission,
)
from .services import token_hash, token_new
from .signals import agent_created


def scoped_form(scope: str) -> type[forms.ModelForm]:
    class ScopedPermissionForm(forms.ModelForm):
        class Meta:
            model = ToolPermission
            fields = ["pattern", "action", "note"]

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.instance.scope = scope

    return ScopedPermissionForm


class StampedPermissionsMixin:
    """Every saved permission records who changed it."""

    def save_formset(self, request, form, formset, change):
        for instance in formset.save(commit=False):
            instance.changed_by = request.user
            instance.save()
        for obj in formset.deleted_objects:
            obj.delete()
        formset.save_m2m()


class AgentPermissionInline(admin.TabularInline):
    model = ToolPermission
    form = scoped_form(Scope.AGENT)
    fk_name = "agent"
    extra = 1
    readonly_fields = ["changed_by", "changed_at"]
    fields = ["pattern", "action", "note", "changed_by", "changed_at"]
    verbose_name = "agent permission"


class ChannelPermissionInline(AgentPermissionInline):
    form = scoped_form(Scope.CHANNEL)
    fk_name = "channel"
    verbose_name = "channel permission"


@admin.register(Agent)
class AgentAdmin(StampedPermissionsMixin, admin.ModelAdmin):
    list_display = ["name", "parent", "exec_tier", "is_active", "created_at"]
    list_filter = ["exec_tier", "is_active"]
    search_fields = ["name"]
    fields = ["name", "parent", "exec_tier", "is_active"]
    inlines = [AgentPermissionInline]

    def save_model(self, request, obj, form, change):
        if not change:
            token = token_new("aleph_agent")
            obj.token_hash = token_hash(token)
            messages.warning(request, f"Agent {obj.name}'s API token, shown only this once: {token}")
        super().save_model(request, obj, form, change)
        if not change:
            agent_created.send(sender=Agent, agent=obj)


@admin.register(Channel)
class ChannelAdmin(StampedPermissionsMixin, admin.ModelAdmin):
    list_display = ["name", "kind", "unattended", "exec_tier", "max_tier", "approval_timeout_s"]
    list_filter = ["kind", "unattended"]
    search_fields = ["name"]
    filter_horizontal = ["operators"]
    inlines = [ChannelPermissionInline]


@admin.register(GlobalToolPermission)
class GlobalPermissionAdmin(admin.ModelAdmin):
    list_display = ["pattern", "action", "note", "changed_by", "changed_at"]
    list_filter = ["action"]
    search_fields = ["pattern", "note"]
    fields = ["pattern", "action", "note", "changed_by", "changed_at"]
    readonly_fields = ["changed_by", "changed_at"]

    def get_queryset(self, request):
        return super().get_queryset(request).filter(scope=Scope.GLOBAL)

    def save_model(self, request, obj, form, change):
        obj.scope = Scope.GLOBAL
        obj.changed_by = request.user
        super().save_model(request, obj, form, change)


@admin.register(PolicyState)
class PolicyStateAdmin(admin.ModelAdmin):
    list_display = ["exec_tier", "updated_by", "updated_at"]
    fields = ["exec_tier", "updated_by", "updated_at"]
    readonly_fields = ["updated_by", "updated_at"]

    def has_add_permission(self, request):
        return not PolicyState.objects.exists()

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        obj.updated_by = request.user
        super().save_model(request, obj, form, change)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "agent", "channel", "tool", "status", "decided_by", "rule"]
    list_filter = ["status", "decided_by", "channel"]
    search_fields = ["tool", "rule", "agent__name"]
    date_hierarchy = "created_at"
    list_select_related = ["agent", "channel"]


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = ["agent", "key", "exec_tier", "created_at"]
    search_fields = ["key", "agent__name"]
    readonly_fields = ["agent", "key", "created_at"]

    def has_add_permission(self, request):
        return False


@admin.register(NetworkAllow)
class NetworkAllowAdmin(admin.ModelAdmin):
    """The outbound allow list; every change makes each server process re-read it on its next fetch."""

    list_display = ["entry", "note", "changed_by", "changed_at"]
    search_fields = ["entry", "note"]
    fields = ["entry", "note", "changed_by", "changed_at"]
    readonly_fields = ["changed_by", "changed_at"]

    def save_model(self, request, obj, form, change):
        obj.changed_by = request.user
        super().save_model(request, obj, form, change)


@admin.register(CommandRule)
class CommandRuleAdmin(admin.ModelAdmin):
    """The admin's command-policy rules (the hardline rules are built in and cannot be changed here); every process's
    floor and sandbox use a change from their next call on."""

    list_display = ["name", "action", "regex", "reason", "changed_by", "changed_at"]
    list_filter = ["action"]
    search_fields = ["name", "regex", "reason"]
    fields = ["name", "action", "regex", "reason", "changed_by", "changed_at"]
    readonly_fields = ["changed_by", "changed_at"]

    def save_model(self, request, obj, form, change):
        obj.changed_by = request.user
        super().save_model(request, obj, form, change)


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin):
    """MCP servers; each process's manager reconnects a changed server (status fields are the manager's)."""

    list_display = ["name", "transport", "enabled", "status", "connected_since", "changed_by", "changed_at"]
    list_filter = ["transport", "enabled", "status"]
    search_fields = ["name", "command", "url"]
    fields = [
        "name",
        "transport",
        "command",
        "args",
        "env",
        "url",
        "headers",
        "network_allow",
        "enabled",
        "call_timeout_s",
        "status",
        "last_error",
        "capabilities",
        "connected_since",
        "changed_by",
        "changed_at",
    ]
    readonly_fields = ["status", "last_error", "capabilities", "connected_since", "changed_by", "changed_at"]

    def save_model(self, request, obj, form, change):
        obj.changed_by = request.user
        super().save_model(request, obj, form, change)
