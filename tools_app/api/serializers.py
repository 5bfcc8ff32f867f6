"""Request validation and the documented response shapes of the API."""

from collections.abc import Mapping

from rest_framework import serializers

from ..chokepoint.service import DISPATCHER_FORMATS

CHANNEL_HELP = "The channel the agent acts in."


class StrictRequestSerializer(serializers.Serializer):
    """A request body naming a field this API does not know (say, "agent") is refused, never silently ignored."""

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


class ErrorBodySerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    detail = serializers.DictField()


class ErrorSerializer(serializers.Serializer):
    error = ErrorBodySerializer()


class FactsSerializer(serializers.Serializer):
    idempotent = serializers.BooleanField()
    requires_approval = serializers.BooleanField()


class ToolDefinitionSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField(allow_blank=True)
    input_schema = serializers.DictField()
    facts = FactsSerializer(allow_null=True, help_text="Null when Aleph has no facts for the tool.")


class ChannelQuerySerializer(serializers.Serializer):
    channel = serializers.CharField(max_length=64, help_text=CHANNEL_HELP)


class SchemaQuerySerializer(ChannelQuerySerializer):
    format = serializers.ChoiceField(choices=DISPATCHER_FORMATS, default="openai")


class DecisionSerializer(serializers.Serializer):
    verdict = serializers.ChoiceField(choices=["allow", "ask", "deny"])
    decided_by = serializers.CharField()
    rule = serializers.CharField()
    reason = serializers.CharField(allow_blank=True)
    approval = serializers.CharField(allow_null=True)


class ToolErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    detail = serializers.DictField()


class ResultSerializer(serializers.Serializer):
    success = serializers.BooleanField()
    output = serializers.JSONField(allow_null=True)
    error = ToolErrorSerializer(allow_null=True)
    duration_ms = serializers.IntegerField(allow_null=True)


class CallSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    tool = serializers.CharField()
    status = serializers.ChoiceField(
        choices=["pending_approval", "running", "succeeded", "failed", "denied", "expired"]
    )
    decision = DecisionSerializer()
    result = ResultSerializer(allow_null=True)


class CallCreateSerializer(StrictRequestSerializer):
    tool = serializers.CharField(max_length=128)
    input = serializers.DictField(default=dict, help_text="The tool's arguments, a JSON object.")
    channel = serializers.CharField(max_length=64, help_text=CHANNEL_HELP)
    session = serializers.CharField(max_length=100, required=False, allow_blank=False)
    wait = serializers.FloatField(
        min_value=0, max_value=300, default=10, help_text="Seconds to wait for an approval before answering 202."
    )


class CallWaitSerializer(serializers.Serializer):
    wait = serializers.FloatField(min_value=0, max_value=300, default=0)


class ExplainRequestSerializer(StrictRequestSerializer):
    agent = serializers.CharField(max_length=64)
    channel = serializers.CharField(max_length=64)
    tool = serializers.CharField(max_length=128)
    input = serializers.DictField(default=dict)
    session = serializers.CharField(max_length=100, required=False)


class TraceStepSerializer(serializers.Serializer):
    step = serializers.CharField()
    result = serializers.JSONField(allow_null=True)
    note = serializers.CharField(allow_blank=True)


class ExplainSerializer(serializers.Serializer):
    decision = DecisionSerializer()
    trace = TraceStepSerializer(many=True)


class HealthSerializer(serializers.Serializer):
    status = serializers.CharField()
    versions = serializers.DictField()
    database = serializers.DictField()
    channel_layer = serializers.DictField()
    sandbox = serializers.DictField()
    mcp_servers = serializers.ListField(child=serializers.DictField())
    tools = serializers.IntegerField()
