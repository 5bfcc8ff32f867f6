"""Query validation and the documented response shapes of the ledger API."""

from rest_framework import serializers

from .entries import ACTIONS, MAX_SAFE_INT, OUTCOMES

PAGE_LIMIT = 500


class EntryQuerySerializer(serializers.Serializer):
    """Filters and keyset cursors for a chain; empty values count as absent (an HTML form sends them)."""

    action = serializers.ChoiceField(choices=ACTIONS, required=False)
    outcome = serializers.ChoiceField(choices=OUTCOMES, required=False)
    tool = serializers.CharField(required=False, max_length=128)
    principal = serializers.CharField(required=False, max_length=150)
    since = serializers.DateTimeField(required=False, help_text="Entries at or after this time (RFC 3339).")
    until = serializers.DateTimeField(required=False, help_text="Entries before this time (RFC 3339).")
    before = serializers.IntegerField(required=False, min_value=1, max_value=MAX_SAFE_INT, help_text="Older: seq <")
    after = serializers.IntegerField(required=False, min_value=0, max_value=MAX_SAFE_INT, help_text="Newer: seq >")
    limit = serializers.IntegerField(required=False, min_value=1, max_value=PAGE_LIMIT, default=100)

    def to_internal_value(self, data):
        return super().to_internal_value({k: v for k, v in data.items() if v not in ("", None)})

    def validate(self, attrs):
        if attrs.get("before") is not None and attrs.get("after") is not None:
            raise serializers.ValidationError({"before": ["Give before or after, not both."]})
        return attrs


class VerifyQuerySerializer(serializers.Serializer):
    expect_head = serializers.RegexField(
        r"^[1-9][0-9]{0,15}:[0-9a-f]{64}$",
        required=False,
        help_text="SEQ:HASH of a head written down earlier; a chain that no longer reaches it is truncated.",
    )


class EntrySerializer(serializers.Serializer):
    """The signed fields (docs/ledger-format.md), then the hash and the signature."""

    v = serializers.IntegerField()
    agent = serializers.CharField()
    seq = serializers.IntegerField()
    time = serializers.CharField()
    action = serializers.CharField()
    tool = serializers.CharField(allow_null=True)
    outcome = serializers.CharField()
    args_sha256 = serializers.CharField(allow_null=True)
    detail = serializers.DictField()
    principal = serializers.CharField(allow_null=True)
    call = serializers.CharField(allow_null=True)
    signer = serializers.CharField()
    prev_hash = serializers.CharField()
    hash = serializers.CharField()
    signature = serializers.CharField()


class EntryPageSerializer(serializers.Serializer):
    agent = serializers.CharField()
    results = EntrySerializer(many=True)
    next = serializers.CharField(allow_null=True, help_text="Older entries.")
    previous = serializers.CharField(allow_null=True, help_text="Newer entries.")


class HeadSerializer(serializers.Serializer):
    seq = serializers.IntegerField(allow_null=True)
    hash = serializers.CharField(allow_null=True)


class BreakSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(
        choices=[
            "non_canonical",
            "edited",
            "foreign_agent",
            "sequence_gap",
            "out_of_order",
            "broken_link",
            "unknown_signer",
            "bad_signature",
            "truncated",
        ]
    )
    seq = serializers.IntegerField(allow_null=True)
    message = serializers.CharField()


class VerifyReportSerializer(serializers.Serializer):
    agent = serializers.CharField()
    ok = serializers.BooleanField()
    entries = serializers.IntegerField()
    head = HeadSerializer(allow_null=True)
    keys = serializers.IntegerField()
    active_key = serializers.CharField(allow_null=True)
    breaks = BreakSerializer(many=True, help_text="The first break of each kind, in chain order.")
    counts = serializers.DictField(child=serializers.IntegerField(), help_text="How many entries broke each way.")
