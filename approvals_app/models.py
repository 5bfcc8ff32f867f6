"""Approval requests (one per call that asked a person) and the standing grants a decision can leave behind."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q


class Status(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    DENIED = "denied", "Denied"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"


class DecisionScope(models.TextChoices):
    ONCE = "once", "Once"
    SESSION = "session", "This session"
    ALWAYS = "always", "Always"
    UNTIL = "until", "Until a time"


class ApprovalRequest(models.Model):
    """A call waiting for a person, bound to the SHA-256 of its canonical arguments."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    call = models.OneToOneField("tools_app.ToolCall", on_delete=models.CASCADE, related_name="approval_request")
    agent = models.ForeignKey("tools_app.Agent", on_delete=models.CASCADE, related_name="approval_requests")
    channel = models.ForeignKey("tools_app.Channel", on_delete=models.CASCADE, related_name="approval_requests")
    session = models.ForeignKey(
        "tools_app.Session", null=True, blank=True, on_delete=models.SET_NULL, related_name="approval_requests"
    )
    tool = models.CharField(max_length=128)
    arguments = models.JSONField(default=dict, help_text="As the card shows them: secret arguments redacted.")
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of the canonical arguments.")
    asked_by = models.CharField(max_length=16, help_text="What asked: entry, tier or floor.")
    rule = models.CharField(max_length=300)
    reason = models.TextField(blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField()
    deadline = models.DateTimeField()
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    scope = models.CharField(max_length=8, choices=DecisionScope.choices, blank=True)
    decision_reason = models.TextField(blank=True)
    until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["status", "deadline"]),
            models.Index(fields=["channel", "-created_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.tool} for {self.agent_id} ({self.status})"


class Grant(models.Model):
    """A standing permission a decision left behind: consulted before asking, never above a deny or a floor."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tool = models.CharField(max_length=128, help_text="A tool name or a glob.")
    fingerprint = models.CharField(max_length=64, blank=True, help_text="Empty: any arguments.")
    agent = models.ForeignKey("tools_app.Agent", on_delete=models.CASCADE, related_name="grants")
    channel = models.ForeignKey("tools_app.Channel", on_delete=models.CASCADE, related_name="grants")
    session = models.ForeignKey(
        "tools_app.Session", null=True, blank=True, on_delete=models.CASCADE, related_name="grants"
    )
    scope = models.CharField(max_length=8, choices=DecisionScope.choices)
    granted_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    source = models.OneToOneField(
        ApprovalRequest, null=True, blank=True, on_delete=models.SET_NULL, related_name="grant"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    uses = models.PositiveIntegerField(default=0)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["agent", "channel", "revoked_at"])]
        constraints = [
            models.CheckConstraint(
                name="grant_session_scope",
                condition=Q(scope="session", session__isnull=False) | ~Q(scope="session"),
            ),
            models.CheckConstraint(
                name="grant_until_scope",
                condition=Q(scope="until", expires_at__isnull=False) | ~Q(scope="until"),
            ),
            models.CheckConstraint(name="grant_not_once", condition=~Q(scope="once")),
        ]

    def __str__(self) -> str:
        return f"{self.tool} ({self.scope})"
