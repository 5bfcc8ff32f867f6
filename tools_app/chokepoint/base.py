"""Tool abstractions: definitions, facts, results and the typed and untyped tool bases."""

from __future__ import annotations

import functools
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import jsonschema
from pydantic import BaseModel, ConfigDict, ValidationError

# Tools that always ask a person, whatever the tier or an allow entry says; only a deny entry stops them earlier.
CONFIRMATION_REQUIRED_TOOLS = frozenset(
    {
        "vault_store",
        "agent_delete",
        "agent_create",
        "team_disband",
        "key_rotate",
        "key_revoke",
    }
)

# Tools that would change the settings gating the agent itself: no agent may ever run them.
SELF_PROTECTED_TOOLS = frozenset(
    {
        "policy_import",
        "permission_set",
        "permission_delete",
        "exec_tier_set",
        "command_policy_set",
    }
)


@dataclass(frozen=True)
class ToolFacts:
    """What the exec tier reads; None in place of facts means "unknown" and fails closed."""

    idempotent: bool
    requires_approval: bool

    def as_dict(self) -> dict[str, bool]:
        return {"idempotent": self.idempotent, "requires_approval": self.requires_approval}


READ_ONLY = ToolFacts(idempotent=True, requires_approval=False)
MUTATING = ToolFacts(idempotent=False, requires_approval=False)
DESTRUCTIVE = ToolFacts(idempotent=False, requires_approval=True)


@dataclass(frozen=True)
class ToolError:
    code: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "detail": self.detail}


@dataclass
class ToolResult:
    success: bool
    output: Any = None
    error: ToolError | None = None
    duration_ms: int = 0

    @classmethod
    def ok(cls, output: Any) -> ToolResult:
        return cls(success=True, output=output)

    @classmethod
    def fail(cls, code: str, message: str, **detail: Any) -> ToolResult:
        return cls(success=False, error=ToolError(code, message, detail))

    def as_dict(self) -> dict[str, Any]:
        return {
            "success": self.success,
            "output": self.output,
            "error": self.error.as_dict() if self.error else None,
            "duration_ms": self.duration_ms,
        }


@dataclass(frozen=True)
class ToolDefinition:
    name: str
    description: str
    input_schema: dict[str, Any]
    facts: ToolFacts | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "facts": self.facts.as_dict() if self.facts else None,
        }


@dataclass(frozen=True)
class ToolContext:
    """Who is calling: handed to a tool so it acts for that agent only."""

    call_id: str
    agent_id: int
    agent_name: str
    channel_name: str
    session_key: str | None
    attended: bool


class ToolInputError(Exception):
    def __init__(self, message: str, errors: list[dict[str, Any]]):
        super().__init__(message)
        self.errors = errors


class BaseTool(ABC):
    """What the registry and the chokepoint see of any tool."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    facts: ClassVar[ToolFacts | None] = None
    requires: ClassVar[tuple[str, ...]] = ()
    secret_arguments: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **dependencies: Any):
        self.dependencies = dependencies

    @abstractmethod
    def input_schema(self) -> dict[str, Any]: ...

    @abstractmethod
    def parse(self, raw: dict[str, Any]) -> Any:
        """Validate raw input into the tool's arguments or raise ToolInputError."""

    @abstractmethod
    async def call(self, args: Any, ctx: ToolContext) -> ToolResult: ...

    def redact(self, raw_input: dict[str, Any]) -> dict[str, Any]:
        """The input as the event log, the approval card and the ledger may show it: secrets replaced."""
        if not self.secret_arguments:
            return raw_input
        return {k: "[redacted]" if k in self.secret_arguments else v for k, v in raw_input.items()}

    def asks_for_arguments(self, args: Any) -> bool:
        """True when these arguments make the call destructive (file_ops delete, say)."""
        return False

    def facts_for(self, args: Any) -> ToolFacts | None:
        if self.facts is None:
            return None
        if self.asks_for_arguments(args):
            return ToolFacts(idempotent=False, requires_approval=True)
        return self.facts

    def definition(self) -> ToolDefinition:
        return ToolDefinition(self.name, self.description, self.input_schema(), self.facts)

    def missing_dependency(self) -> str | None:
        for name in self.requires:
            if self.dependencies.get(name) is None:
                return name
        return None

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Call the tool, turning a missing dependency or a crash into a failed result."""
        started = time.perf_counter()
        missing = self.missing_dependency()
        if missing is not None:
            result = ToolResult.fail("not_configured", f"{missing} not configured")
        else:
            try:
                result = await self.call(args, ctx)
            except Exception as exc:  # a tool's crash is the call's failure, never the gateway's
                result = ToolResult.fail("tool_error", f"{type(exc).__name__}: {exc}")
        result.duration_ms = int((time.perf_counter() - started) * 1000)
        return result


class TypedTool(BaseTool):
    """A tool whose pydantic argument model gives both the JSON Schema and the validation."""

    Args: ClassVar[type[BaseModel]]

    def input_schema(self) -> dict[str, Any]:
        return args_schema(self.Args)

    def parse(self, raw: dict[str, Any]) -> BaseModel:
        try:
            return self.Args.model_validate(raw, strict=False)
        except ValidationError as exc:
            errors = [
                {"loc": ".".join(str(p) for p in e["loc"]), "msg": e["msg"], "type": e["type"]}
                for e in exc.errors(include_url=False, include_input=False)
            ]
            raise ToolInputError(f"invalid arguments for {self.name}", errors) from None


@functools.cache
def args_schema(args: type[BaseModel]) -> dict[str, Any]:
    """An argument model's JSON Schema, built once: pydantic takes about a millisecond a model, and every listing of
    the tools (GET tools/, MCP tools/list) asks for all of them."""
    schema = args.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema.setdefault("required", [])
    return schema


class ToolArgs(BaseModel):
    """Base for argument models: unknown fields are an error, and docstrings describe fields."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class UntypedTool(BaseTool):
    """A tool known only by a JSON Schema (an MCP server's tool, say); input is validated against it."""

    schema: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}

    def input_schema(self) -> dict[str, Any]:
        return self.schema

    @functools.cached_property
    def input_validator(self) -> jsonschema.protocols.Validator:
        """Built once per tool: a validator made per call cost more than the check itself."""
        return jsonschema.Draft202012Validator(self.input_schema())

    def parse(self, raw: dict[str, Any]) -> dict[str, Any]:
        errors = [
            {"loc": ".".join(str(p) for p in e.absolute_path), "msg": e.message, "type": e.validator}
            for e in self.input_validator.iter_errors(raw)
        ]
        if errors:
            raise ToolInputError(f"invalid arguments for {self.name}", errors)
        return raw


class UntypedToolAdapter(UntypedTool):
    """Adapts a plain async function and a schema into a tool."""

    def __init__(
        self,
        *,
        name: str,
        description: str,
        schema: dict[str, Any],
        function: Callable[[dict[str, Any], ToolContext], Awaitable[Any]],
        facts: ToolFacts | None,
    ):
        super().__init__()
        self.name = name
        self.description = description
        self.facts = facts
        self._schema = schema
        self._function = function

    def input_schema(self) -> dict[str, Any]:
        return self._schema

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        output = await self._function(args, ctx)
        return output if isinstance(output, ToolResult) else ToolResult.ok(output)
