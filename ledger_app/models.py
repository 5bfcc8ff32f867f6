"""Agent keys, chain heads, the append-only ledger entries and the record of each verification."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from tools_app.models import Agent


class KeyStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    ROTATED = "rotated", "Rotated"
    REVOKED = "revoked", "Revoked"


class AgentKey(models.Model):
    """An agent's Ed25519 key: the public half in the clear, the seed sealed; never deleted (a trigger refuses it)."""

    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="ledger_keys")
    fingerprint = models.CharField(max_length=64, unique=True)
    public_key = models.CharField(max_length=44)
    sealed_seed = models.BinaryField(editable=False)
    status = models.CharField(max_length=8, choices=KeyStatus.choices, default=KeyStatus.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["agent"], condition=Q(status="active"), name="one_active_key_per_agent")
        ]

    def __str__(self) -> str:
        return f"{self.agent_id}:{self.fingerprint[:16]} ({self.status})"


class ChainHead(models.Model):
    """One agent's chain head: its last seq and hash, and the key that signs next. Every append locks and moves it."""

    agent = models.OneToOneField(Agent, on_delete=models.PROTECT, primary_key=True, related_name="ledger_head")
    name = models.CharField(max_length=64, help_text="The agent's name when its chain began; every entry carries it.")
    seq = models.PositiveBigIntegerField(default=0)
    hash = models.CharField(max_length=64)
    key = models.ForeignKey(AgentKey, on_delete=models.PROTECT, related_name="+")
    last_time = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} @ {self.seq}"


class LedgerEntry(models.Model):
    """One signed entry: `body` holds the exact canonical bytes that were hashed; the other columns index them."""

    # The unique (agent, seq) index serves every lookup by agent: no separate index on the foreign key.
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="ledger_entries", db_index=False)
    seq = models.PositiveBigIntegerField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    signature = models.CharField(max_length=88)
    body = models.TextField()
    time = models.DateTimeField()
    action = models.CharField(max_length=20)
    tool = models.CharField(max_length=128, null=True, blank=True)
    outcome = models.CharField(max_length=8)
    principal = models.CharField(max_length=150, null=True, blank=True)
    signer = models.CharField(max_length=64)

    class Meta:
        ordering = ["agent", "seq"]
        verbose_name_plural = "ledger entries"
        constraints = [
            models.UniqueConstraint(fields=["agent", "seq"], name="ledger_unique_seq"),
            models.UniqueConstraint(fields=["agent", "prev_hash"], name="ledger_unique_prev_hash"),
        ]
        indexes = [
            models.Index(fields=["agent", "action", "seq"], name="ledger_by_action"),
            models.Index(fields=["agent", "outcome", "seq"], name="ledger_by_outcome"),
            models.Index(fields=["agent", "tool", "seq"], name="ledger_by_tool"),
            models.Index(fields=["agent", "principal", "seq"], name="ledger_by_principal"),
            # Time filters, and the hourly chart counts outcomes from the index alone.
            models.Index(fields=["agent", "time", "outcome"], name="ledger_by_time_outcome"),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id}#{self.seq} {self.action}"


class ChainVerification(models.Model):
    """What one verification of a chain found: the badge on the auditors' pages is the latest of these."""

    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="ledger_verifications")
    checked_at = models.DateTimeField(auto_now_add=True)
    ok = models.BooleanField()
    entries = models.PositiveBigIntegerField()
    head_seq = models.PositiveBigIntegerField()
    head_hash = models.CharField(max_length=64)
    first_break_seq = models.BigIntegerField(null=True, blank=True)
    report = models.JSONField()
    source = models.CharField(max_length=8)
    checked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-checked_at", "-id"]
        indexes = [models.Index(fields=["agent", "-id"], name="ledger_verification_latest")]

    def __str__(self) -> str:
        return f"{self.agent_id} {'ok' if self.ok else 'broken'} at {self.checked_at:%Y-%m-%d %H:%M}"
