import json
import os

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from tools_app.models import Agent, Channel
from tools_app.policy_toml import policy_import
from tools_app.services import agent_create, user_create

DEMO_PEOPLE = (
    ("admin", "admin", "aleph-admin"),
    ("alice", "operator", "aleph-operator"),
    ("audrey", "auditor", "aleph-auditor"),
)
DEMO_AGENTS = (("builder", None, "auto"), ("scout", None, None))

DEMO_POLICY = """
[policies]
exec_tier = "ask"

[policies.tool_permissions]
"note_search" = "allow"

[[agents]]
name = "builder"
exec_tier = "auto"

[[agents]]
name = "scout"

[agents.tool_permissions]
"vault_store" = "deny"

[[channels]]
name = "ops"
kind = "web"
max_tier = "auto"
approval_timeout_s = 120
operators = ["alice"]

[[channels]]
name = "nightly"
kind = "cron"
unattended = true
"""


class Command(BaseCommand):
    help = "Demo people (admin, operator, auditor), agents builder and scout, channels ops and nightly, and a policy."

    def handle(self, *args, **options):
        token_file = settings.DATA_DIR / "demo-tokens.json"
        tokens = json.loads(token_file.read_text()) if token_file.exists() else {}
        User = get_user_model()
        for name, role, password in DEMO_PEOPLE:
            if not User.objects.filter(username=name).exists():
                _, tokens[f"user:{name}"] = user_create(name=name, role=role, password=password)
        for name, parent, tier in DEMO_AGENTS:
            if not Agent.objects.filter(name=name).exists():
                _, tokens[f"agent:{name}"] = agent_create(name=name, exec_tier=tier, parent=parent)
        if not Channel.objects.exists():
            policy_import(text=DEMO_POLICY)
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(tokens, handle, indent=2)
        self.stdout.write("Demo sign-ins (username / password):")
        for name, role, password in DEMO_PEOPLE:
            self.stdout.write(f"  {role:9} {name} / {password}")
        self.stdout.write(f"Demo API tokens are in {token_file}:")
        for key, token in sorted(tokens.items()):
            self.stdout.write(f"  {key:14} {token}")
