"""The vault: secrets stored encrypted under a name, never returned to the model."""

from asgiref.sync import sync_to_async
from pydantic import Field

from ..chokepoint.base import DESTRUCTIVE, ToolArgs, ToolContext, ToolResult, TypedTool
from ..models import VaultSecret


class VaultStore(TypedTool):
    name = "vault_store"
    description = "Store a secret under a name, encrypted at rest; it is never shown again."
    facts = DESTRUCTIVE
    requires = ("vault_box",)
    secret_arguments = ("value",)

    class Args(ToolArgs):
        name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$", description="The name to store the secret under.")
        value: str = Field(min_length=1, max_length=10_000, description="The secret itself.")

    async def call(self, args: Args, ctx: ToolContext) -> ToolResult:
        ciphertext = self.dependencies["vault_box"].encrypt(args.value.encode())
        created = await sync_to_async(self._store)(ctx.agent_id, args.name, bytes(ciphertext))
        return ToolResult.ok({"name": args.name, "stored": True, "replaced": not created})

    @staticmethod
    def _store(agent_id: int, name: str, ciphertext: bytes) -> bool:
        _, created = VaultSecret.objects.update_or_create(
            agent_id=agent_id, name=name, defaults={"ciphertext": ciphertext}
        )
        return created
