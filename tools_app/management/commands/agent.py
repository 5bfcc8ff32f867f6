import json

from django.core.management.base import BaseCommand, CommandError

from tools_app.services import ApplicationError, agent_create


class Command(BaseCommand):
    help = "Manage agents: `agent create NAME [--tier T] [--parent P] [--json]` prints the API token once."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create an agent with its own key and token")
        create.add_argument("name")
        create.add_argument("--tier", choices=["ask", "auto", "full"])
        create.add_argument("--parent")
        create.add_argument("--json", action="store_true")

    def handle(self, *args, **options):
        try:
            agent, token = agent_create(name=options["name"], exec_tier=options["tier"], parent=options["parent"])
        except ApplicationError as exc:
            raise CommandError(exc.message) from None
        public_key = getattr(agent, "public_key_b64", None)
        if options["json"]:
            self.stdout.write(json.dumps({"name": agent.name, "token": token, "public_key": public_key}))
        else:
            self.stdout.write(f"Agent {agent.name} created. Its API token, shown only this once:\n{token}")
