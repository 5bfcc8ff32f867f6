"""What the approvals API accepts and returns."""

from rest_framework import serializers

from tools_app.api.serializers import StrictRequestSerializer

from .models import DecisionScope, Status
from .services import DECISIONS, MATCHES


class DecideSerializer(StrictRequestSerializer):
    decision = serializers.ChoiceField(choices=DECISIONS)
    scope = serializers.ChoiceField(choices=DecisionScope.values, default=DecisionScope.ONCE)
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    until = serializers.DateTimeField(required=False, allow_null=True, default=None)
    match = serializers.ChoiceField(
        choices=MATCHES,
        default="arguments",
        help_text="What a grant covers: these exact arguments (the default) or any arguments to the tool.",
    )


class SocketDecideSerializer(DecideSerializer):
    type = serializers.ChoiceField(choices=["decide"])
    id = serializers.UUIDField()


class ApprovalQuerySerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=Status.values, required=False)


class ApprovalCardSerializer(serializers.Serializer):
    """One card: the call, who asked and why, and how it ended."""

    id = serializers.UUIDField()
    call = serializers.UUIDField()
    agent = serializers.CharField()
    channel = serializers.CharField()
    session = serializers.CharField(allow_null=True)
    tool = serializers.CharField()
    arguments = serializers.JSONField(help_text="Secret arguments are redacted.")
    fingerprint = serializers.CharField(help_text="SHA-256 of the canonical arguments.")
    asked_by = serializers.CharField(help_text="entry, tier or floor")
    rule = serializers.CharField()
    reason = serializers.CharField()
    status = serializers.ChoiceField(choices=Status.values)
    created_at = serializers.DateTimeField()
    deadline = serializers.DateTimeField()
    decided_by = serializers.CharField(allow_null=True)
    decided_at = serializers.DateTimeField(allow_null=True)
    scope = serializers.ChoiceField(choices=DecisionScope.values, allow_null=True)
    decision_reason = serializers.CharField()
    until = serializers.DateTimeField(allow_null=True)
