import json

from django.core.management.base import BaseCommand, CommandError

from tools_app.services import ROLES, ApplicationError, user_create


class Command(BaseCommand):
    help = "Manage people: `user create NAME --role admin|operator|auditor [--password P] [--json]`."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a person with a role and a personal API token")
        create.add_argument("name")
        create.add_argument("--role", choices=ROLES, required=True)
        create.add_argument("--password")
        create.add_argument("--json", action="store_true")

    def handle(self, *args, **options):
        try:
            user, token = user_create(name=options["name"], role=options["role"], password=options["password"])
        except ApplicationError as exc:
            raise CommandError(exc.message) from None
        if options["json"]:
            self.stdout.write(json.dumps({"name": user.username, "token": token}))
        else:
            self.stdout.write(
                f"User {user.username} ({options['role']}) created. API token, shown only this once:\n{token}"
            )
