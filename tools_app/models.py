"""Agents, channels, permissions, sessions and the event log of every tool call."""

import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q


class ChangeStamped(models.Model):
    """A piece of policy people edit: who changed it last (none when a policy file or a script did), and when."""

    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class ExecTier(models.TextChoices):
    ASK = "ask", "Ask"
    AUTO = "auto", "Auto"
    FULL = "full", "Full"


class Action(models.TextChoices):
    ALLOW = "allow", "Allow"
    ASK = "ask", "Ask"
    DENY = "deny", "Deny"


class Scope(models.TextChoices):
    GLOBAL = "global", "Global"
    AGENT = "agent", "Agent"
    CHANNEL = "channel", "Channel"


class ChannelKind(models.TextChoices):
    WEB = "web", "Web"
    CHAT = "chat", "Chat"
    CRON = "cron", "Cron"
    HEARTBEAT = "heartbeat", "Heartbeat"
    A2A = "a2a", "Agent to agent"
    API = "api", "API"


name_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$",
    "Use 1-64 letters, digits, '_', '.', ':' or '-', starting with a letter or digit.",
)
pattern_validator = RegexValidator(
    r"^[A-Za-z0-9_*?.:-]{1,128}$",
    "A pattern is a tool name or a glob of letters, digits, '_', '-', '.', ':', '*' and '?'.",
)


def new_policy_version() -> str:
    return uuid.uuid4().hex


class PolicyState(models.Model):
    """The global exec tier and the version every server process compiles its policy from."""

    exec_tier = models.CharField(max_length=8, choices=ExecTier.choices, default=ExecTier.ASK)
    version = models.CharField(max_length=32, default=new_policy_version)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        verbose_name = "global policy"
        verbose_name_plural = "global policy"

    def __str__(self) -> str:
        return f"global exec tier {self.exec_tier}"


class Agent(models.Model):
    name = models.CharField(max_length=64, unique=True, validators=[name_validator])
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    exec_tier = models.CharField(
        max_length=8, choices=ExecTier.choices, null=True, blank=True, help_text="Empty: inherit."
    )
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Channel(models.Model):
    name = models.CharField(max_length=64, unique=True, validators=[name_validator])
    kind = models.CharField(max_length=16, choices=ChannelKind.choices, default=ChannelKind.WEB)
    unattended = models.BooleanField(default=False, help_text="Nobody can answer an approval card here.")
    exec_tier = models.CharField(
        max_length=8, choices=ExecTier.choices, null=True, blank=True, help_text="Empty: inherit."
    )
    max_tier = models.CharField(
        max_length=8,
        choices=ExecTier.choices,
        null=True,
        blank=True,
        help_text="The highest tier any call here runs at.",
    )
    approval_timeout_s = models.PositiveIntegerField(
        default=120, validators=[MinValueValidator(1), MaxValueValidator(86400)]
    )
    operators = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="operated_channels")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ToolPermission(ChangeStamped):
    scope = models.CharField(max_length=8, choices=Scope.choices)
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.CASCADE, related_name="permissions")
    channel = models.ForeignKey(Channel, null=True, blank=True, on_delete=models.CASCADE, related_name="permissions")
    pattern = models.CharField(max_length=128, validators=[pattern_validator])
    action = models.CharField(max_length=8, choices=Action.choices)
    note = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["scope", "pattern"]
        constraints = [
            models.CheckConstraint(
                name="permission_scope_target",
                condition=(
                    Q(scope="global", agent__isnull=True, channel__isnull=True)
                    | Q(scope="agent", agent__isnull=False, channel__isnull=True)
                    | Q(scope="channel", agent__isnull=True, channel__isnull=False)
                ),
            ),
            models.UniqueConstraint(fields=["pattern"], condition=Q(scope="global"), name="unique_global_pattern"),
            models.UniqueConstraint(
                fields=["agent", "pattern"], condition=Q(scope="agent"), name="unique_agent_pattern"
            ),
            models.UniqueConstraint(
                fields=["channel", "pattern"], condition=Q(scope="channel"), name="unique_channel_pattern"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.rule_label}={self.action}"

    @property
    def rule_label(self) -> str:
        if self.scope == Scope.AGENT:
            return f"agent:{self.agent.name}:{self.pattern}"
        if self.scope == Scope.CHANNEL:
            return f"channel:{self.channel.name}:{self.pattern}"
        return f"global:{self.pattern}"


class Session(models.Model):
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="sessions")
    key = models.CharField(max_length=100)
    exec_tier = models.CharField(max_length=8, choices=ExecTier.choices, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["agent", "key"], name="unique_agent_session")]

    def __str__(self) -> str:
        return f"{self.agent}/{self.key}"


class CallStatus(models.TextChoices):
    PENDING_APPROVAL = "pending_approval", "Pending approval"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    DENIED = "denied", "Denied"
    EXPIRED = "expired", "Expired"


FINISHED_STATUSES = (CallStatus.SUCCEEDED, CallStatus.FAILED, CallStatus.DENIED, CallStatus.EXPIRED)


class ToolCall(models.Model):
    """The event log: one row per call, with the decision that let it run or stopped it."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="calls")
    channel = models.ForeignKey(Channel, on_delete=models.PROTECT, related_name="calls")
    session = models.ForeignKey(Session, null=True, blank=True, on_delete=models.SET_NULL, related_name="calls")
    attended = models.BooleanField(default=True)
    tool = models.CharField(max_length=128)
    input = models.JSONField(default=dict)
    status = models.CharField(max_length=20, choices=CallStatus.choices)
    verdict = models.CharField(max_length=8, choices=Action.choices)
    decided_by = models.CharField(max_length=16)
    rule = models.CharField(max_length=300)
    reason = models.TextField(blank=True)
    approval = models.CharField(max_length=64, blank=True)
    principal = models.CharField(max_length=150, blank=True)
    success = models.BooleanField(null=True)
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["agent", "-created_at"]),
            models.Index(fields=["-created_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.tool} ({self.status})"


class PersonToken(models.Model):
    """A person's API token for scripts, stored hashed like an agent's."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_token")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"token of {self.user}"


class Note(models.Model):
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="notes")
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.text[:60]


class VaultSecret(models.Model):
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=128)
    ciphertext = models.BinaryField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["agent", "name"], name="unique_agent_secret")]

    def __str__(self) -> str:
        return f"{self.agent}/{self.name}"


class GlobalToolPermission(ToolPermission):
    """The global scope's entries, edited on their own admin page."""

    class Meta:
        proxy = True
        verbose_name = "global permission"
        verbose_name_plural = "global permissions"


class McpTransport(models.TextChoices):
    STDIO = "stdio", "stdio"
    HTTP = "http", "Streamable HTTP"


class McpStatus(models.TextChoices):
    DISABLED = "disabled", "Disabled"
    CONNECTING = "connecting", "Connecting"
    CONNECTED = "connected", "Connected"
    ERROR = "error", "Error"
    NEEDS_LOGIN = "needs_login", "Needs login"


class McpServer(ChangeStamped):
    """An MCP server whose tools are bridged through the chokepoint; the status fields are the manager's."""

    name = models.CharField(max_length=64, unique=True, validators=[name_validator])
    transport = models.CharField(max_length=8, choices=McpTransport.choices, default=McpTransport.STDIO)
    command = models.CharField(max_length=500, blank=True, help_text="stdio: the executable to start.")
    args = models.JSONField(default=list, blank=True, help_text="stdio: a JSON list of arguments.")
    env = models.JSONField(
        default=dict,
        blank=True,
        help_text="stdio: extra environment variables (JSON object); ${NAME} is NAME from Aleph's environment.",
    )
    url = models.CharField(max_length=2000, blank=True, help_text="http: the server's streamable HTTP endpoint.")
    headers = models.JSONField(
        default=dict,
        blank=True,
        help_text="http: extra request headers (JSON object); ${NAME} is NAME from Aleph's environment.",
    )
    network_allow = models.JSONField(
        default=list,
        blank=True,
        help_text="http: addresses or networks this server may reach although they are not public (admin-approved).",
    )
    enabled = models.BooleanField(default=True)
    call_timeout_s = models.PositiveIntegerField(default=60, validators=[MinValueValidator(1), MaxValueValidator(3600)])
    status = models.CharField(max_length=16, choices=McpStatus.choices, default=McpStatus.CONNECTING, editable=False)
    last_error = models.TextField(blank=True, editable=False)
    capabilities = models.JSONField(default=dict, blank=True, editable=False)
    connected_since = models.DateTimeField(null=True, blank=True, editable=False)
    oauth = models.BinaryField(default=b"", blank=True, editable=False, help_text="OAuth tokens, encrypted.")
    oauth_pending = models.JSONField(default=dict, blank=True, editable=False, help_text="A login in progress.")

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"
        verbose_name_plural = "MCP servers"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from .mcp.config import config_problems

        problems = config_problems(
            transport=self.transport,
            command=self.command,
            args=self.args,
            env=self.env,
            url=self.url,
            headers=self.headers,
            network_allow=self.network_allow,
        )
        if problems:
            raise ValidationError(problems)


def network_entry_validate(value: str) -> None:
    from django.core.exceptions import ValidationError

    from .net.guard import allow_entry_parse

    try:
        allow_entry_parse(value)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


class NetworkAllow(ChangeStamped):
    """One entry of the outbound allow list: the only way a fetch reaches a loopback, private or internal address."""

    entry = models.CharField(
        max_length=300,
        unique=True,
        validators=[network_entry_validate],
        help_text="An exact host (mcp.internal, 10.0.0.5, mcp.internal:8443, [fd00::1]:443) or a network (10.0.0.0/8).",
    )
    note = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["entry"]
        verbose_name = "network allow entry"
        verbose_name_plural = "network allow list"

    def __str__(self) -> str:
        return self.entry


COMMAND_RULE_NAME = r"^[a-z0-9][a-z0-9_-]{0,63}$"


def command_rule_name_validate(value: str) -> None:
    from django.core.exceptions import ValidationError

    from .command_policy import rule_name_problem

    if problem := rule_name_problem(value):
        raise ValidationError(problem)


def command_rule_regex_validate(value: str) -> None:
    from django.core.exceptions import ValidationError

    from .command_policy import rule_regex_problem

    if problem := rule_regex_problem(value):
        raise ValidationError(problem)


class CommandRuleAction(models.TextChoices):
    BLOCK = "block", "Block"
    WARN = "warn", "Warn"


class CommandRule(ChangeStamped):
    """One of the admin's command-policy rules: a regular expression over every command an exec-class call would run
    (as written and as the floor normalises it). Block refuses the call under every tier; warn annotates it."""

    name = models.CharField(
        max_length=64,
        unique=True,
        validators=[
            RegexValidator(COMMAND_RULE_NAME, "lowercase letters, digits, _ and -, starting with a letter or digit"),
            command_rule_name_validate,
        ],
    )
    regex = models.TextField(max_length=1000, validators=[command_rule_regex_validate])
    action = models.CharField(max_length=8, choices=CommandRuleAction.choices)
    reason = models.CharField(max_length=500, blank=True, help_text="What the model is told when the rule fires.")

    class Meta:
        ordering = ["name"]
        verbose_name = "command-policy rule"

    def __str__(self) -> str:
        return self.name
