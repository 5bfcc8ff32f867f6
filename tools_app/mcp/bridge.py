"""The bridge: connected servers' tools as chokepoint tools, and the capability-gated resource and prompt tools."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from mcp.shared.exceptions import MCPError
from pydantic import Field

from ..chokepoint.base import MUTATING, READ_ONLY, ToolArgs, ToolContext, ToolFacts, ToolResult, TypedTool, UntypedTool
from .config import ServerSpec
from .naming import facts_from_annotations, mcp_tool_name, prefixed_resolve, schema_problem

if TYPE_CHECKING:
    from .manager import Connection, McpManager

LISTING_LIMIT = 1000


@dataclass(frozen=True)
class Quarantined:
    server: str
    tool: str
    reason: str


@dataclass(frozen=True)
class Collision:
    name: str
    server: str
    tool: str
    taken_by: str


@dataclass(frozen=True)
class Catalog:
    """What the bridge offers right now; replaced whole on every change, so readers on any thread see one state."""

    tools: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, tuple[str, str]] = field(default_factory=dict)
    quarantined: tuple[Quarantined, ...] = ()
    collisions: tuple[Collision, ...] = ()


class McpTool(UntypedTool):
    """One tool of one connected server, called through the manager's session with that server."""

    def __init__(
        self,
        *,
        manager: McpManager,
        spec: ServerSpec,
        remote: str,
        name: str,
        description: str,
        schema: dict[str, Any],
        facts: ToolFacts | None,
    ):
        super().__init__()
        self.manager = manager
        self.spec = spec
        self.remote = remote
        self.name = name
        self.description = description
        self.facts = facts
        self._schema = schema

    def input_schema(self) -> dict[str, Any]:
        return self._schema

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await self.manager.tool_call(
            server=self.spec.name, tool=self.remote, arguments=args, timeout=self.spec.call_timeout_s
        )


def catalog_build(
    *,
    manager: McpManager,
    connected: list[tuple[ServerSpec, Connection]],
    needs_login: list[str],
    reserved: Any,
) -> Catalog:
    """Name connected servers' tools in connection order: the first holder of a name keeps it, later ones clash."""
    tools: dict[str, Any] = {}
    origins: dict[str, tuple[str, str]] = {}
    quarantined: list[Quarantined] = []
    collisions: list[Collision] = []
    capabilities = {cap for _, connection in connected for cap in connection.capabilities}
    for cls in BRIDGE_TOOLS:
        if cls.capability in capabilities or (cls.capability == "login" and needs_login):
            tools[cls.name] = cls(manager=manager)
    for spec, connection in connected:
        for remote in sorted(connection.tools, key=lambda tool: tool.name):
            problem = schema_problem(remote.input_schema)
            if problem is not None:
                quarantined.append(Quarantined(spec.name, remote.name, problem))
                continue
            name = mcp_tool_name(server=spec.name, tool=remote.name)
            if reserved(name) or name in tools:
                holder = origins.get(name)
                taken_by = f"{holder[0]}:{holder[1]}" if holder else "a built-in tool"
                collisions.append(Collision(name, spec.name, remote.name, taken_by))
                continue
            tools[name] = McpTool(
                manager=manager,
                spec=spec,
                remote=remote.name,
                name=name,
                description=f"[MCP {spec.name}] {remote.description or remote.title or remote.name}",
                schema=remote.input_schema,
                facts=facts_from_annotations(remote.annotations),
            )
            origins[name] = (spec.name, remote.name)
    return Catalog(tools=tools, origins=origins, quarantined=tuple(quarantined), collisions=tuple(collisions))


# -- capability-gated bridge tools -----------------------------------------------------------------


def _dump(value: Any) -> Any:
    return value.model_dump(mode="json", by_alias=True, exclude_none=True)


class BridgeTool(TypedTool):
    capability: ClassVar[str]
    facts = READ_ONLY

    def __init__(self, *, manager: McpManager):
        super().__init__()
        self.manager = manager

    def servers(self, only: str | None) -> list[str]:
        names = sorted(self.manager.connected(self.capability))
        return [n for n in names if n == only] if only else names

    def resolve(self, ident: str) -> tuple[str, str] | None:
        return prefixed_resolve(ident=ident, servers=self.manager.connected(self.capability))

    async def listing(self, only: str | None, key: str, fetch: Any, shape: Any) -> ToolResult:
        """Walk every page of one listing on each server, collecting per-server errors instead of failing."""
        items: list[dict[str, Any]] = []
        errors: dict[str, str] = {}
        servers = self.servers(only)
        if only and not servers:
            return ToolResult.fail(
                "mcp_unavailable", f"No connected MCP server named {only!r} offers {self.capability}."
            )
        for server in servers:
            cursor = None
            try:
                while len(items) < LISTING_LIMIT:
                    page = await self.manager.session_request(
                        server=server, request=lambda c, cur=cursor: fetch(c, cur)
                    )
                    items.extend(shape(server, _dump(item)) for item in getattr(page, key))
                    cursor = page.next_cursor
                    if not cursor:
                        break
            except Exception as exc:  # one server's failure is reported beside the others' listings
                errors[server] = _error_text(exc)
        return ToolResult.ok({key: items[:LISTING_LIMIT], "errors": errors})


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, MCPError):
        return exc.message
    if isinstance(exc, TimeoutError):
        return "The server did not answer in time."
    return str(exc) or type(exc).__name__


class ServerFilter(ToolArgs):
    server: str | None = Field(default=None, max_length=64)
    """Only this MCP server's entries; all connected servers when omitted."""


class ResourcesList(BridgeTool):
    name = "mcp_list_resources"
    description = "List the resources of connected MCP servers; read one with mcp_read_resource and its id."
    capability = "resources"
    Args = ServerFilter

    async def call(self, args: ServerFilter, ctx: ToolContext) -> ToolResult:
        return await self.listing(
            args.server,
            "resources",
            lambda client, cursor: client.list_resources(cursor=cursor),
            lambda server, item: {"id": f"{server}:{item['uri']}", "server": server, **item},
        )


class ResourceTemplatesList(BridgeTool):
    name = "mcp_list_resource_templates"
    description = (
        "List the resource templates of connected MCP servers; fill a template in and read it with mcp_read_resource "
        "as <server>:<uri>."
    )
    capability = "resources"
    Args = ServerFilter

    async def call(self, args: ServerFilter, ctx: ToolContext) -> ToolResult:
        return await self.listing(
            args.server,
            "resource_templates",
            lambda client, cursor: client.list_resource_templates(cursor=cursor),
            lambda server, item: {"id": f"{server}:{item['uriTemplate']}", "server": server, **item},
        )


class ResourceRead(BridgeTool):
    name = "mcp_read_resource"
    description = "Read one resource of a connected MCP server by its id, <server>:<uri>."
    capability = "resources"

    class Args(ToolArgs):
        id: str = Field(min_length=3, max_length=4096)
        """The resource id as listed: the server's name, a colon, then the resource URI."""

    async def call(self, args: Args, ctx: ToolContext) -> ToolResult:
        target = self.resolve(args.id)
        if target is None:
            return ToolResult.fail("mcp_unavailable", f"No connected MCP server with resources matches {args.id!r}.")
        server, uri = target
        try:
            result = await self.manager.session_request(server=server, request=lambda c: c.read_resource(uri))
        except Exception as exc:
            return ToolResult.fail("mcp_error", f"MCP server {server}: {_error_text(exc)}")
        return ToolResult.ok({"server": server, **_dump(result)})


class PromptsList(BridgeTool):
    name = "mcp_list_prompts"
    description = "List the prompts of connected MCP servers; fetch one with mcp_get_prompt and its id."
    capability = "prompts"
    Args = ServerFilter

    async def call(self, args: ServerFilter, ctx: ToolContext) -> ToolResult:
        return await self.listing(
            args.server,
            "prompts",
            lambda client, cursor: client.list_prompts(cursor=cursor),
            lambda server, item: {"id": f"{server}:{item['name']}", "server": server, **item},
        )


class PromptGet(BridgeTool):
    name = "mcp_get_prompt"
    description = "Get one prompt of a connected MCP server by its id, <server>:<prompt name>, with its arguments."
    capability = "prompts"

    class Args(ToolArgs):
        id: str = Field(min_length=3, max_length=512)
        """The prompt id as listed: the server's name, a colon, then the prompt's name."""
        arguments: dict[str, str] = Field(default_factory=dict)
        """The prompt's arguments, by name."""

    async def call(self, args: Args, ctx: ToolContext) -> ToolResult:
        target = self.resolve(args.id)
        if target is None:
            return ToolResult.fail("mcp_unavailable", f"No connected MCP server with prompts matches {args.id!r}.")
        server, prompt = target
        try:
            result = await self.manager.session_request(
                server=server, request=lambda c: c.get_prompt(prompt, args.arguments or None)
            )
        except Exception as exc:
            return ToolResult.fail("mcp_error", f"MCP server {server}: {_error_text(exc)}")
        return ToolResult.ok({"server": server, **_dump(result)})


class Login(BridgeTool):
    name = "mcp_login"
    description = (
        "Start the OAuth login an MCP server asks for. Returns the address a person opens to sign in and allow "
        "access; Aleph connects to the server by itself once they have."
    )
    capability = "login"
    facts = MUTATING

    class Args(ToolArgs):
        server: str = Field(min_length=1, max_length=64)
        """The MCP server that needs a login (its status on the MCP servers page says so)."""

    async def call(self, args: Args, ctx: ToolContext) -> ToolResult:
        url, problem = await self.manager.login(server=args.server)
        if problem == "connected":
            return ToolResult.ok({"server": args.server, "status": "connected"})
        if url is None:
            return ToolResult.fail("mcp_login_unavailable", problem)
        return ToolResult.ok(
            {
                "server": args.server,
                "authorize_url": url,
                "message": f"Open this address, sign in and allow access; Aleph then connects to {args.server}.",
            }
        )


BRIDGE_TOOLS: tuple[type[BridgeTool], ...] = (
    ResourcesList,
    ResourceTemplatesList,
    ResourceRead,
    PromptsList,
    PromptGet,
    Login,
)
BRIDGE_TOOL_NAMES = frozenset(cls.name for cls in BRIDGE_TOOLS)
