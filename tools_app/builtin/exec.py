"""bash_exec and code_exec: programs run only through the injected Sandbox, checked by the command-policy floor."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..chokepoint.base import DESTRUCTIVE, ToolArgs, ToolContext, ToolError, ToolResult, TypedTool
from ..sandbox import ExecRequest, ExecResult, SandboxRefused

MAX_SOURCE_CHARS = 100_000
MAX_TIMEOUT_S = 600


class ExecArgs(ToolArgs):
    working_dir: str = Field(default=".", max_length=4096, description="A directory inside the workspace.")
    timeout: int | None = Field(
        default=None, ge=1, le=MAX_TIMEOUT_S, description="Wall-clock seconds before the whole process tree is killed."
    )


def _result(outcome: ExecResult) -> ToolResult:
    """A command that ran is reported whole, however it ended; a non-zero exit or a timeout marks it failed."""
    output = outcome.as_dict()
    if outcome.timed_out:
        error = ToolError("timed_out", f"Killed after {outcome.duration_ms} ms, with every process it started.")
        return ToolResult(success=False, output=output, error=error)
    if outcome.exit_code != 0:
        return ToolResult(
            success=False, output=output, error=ToolError("exit_status", f"Exited with code {outcome.exit_code}.")
        )
    return ToolResult.ok(output)


async def _run(sandbox, request: ExecRequest) -> ToolResult:
    try:
        outcome = await sandbox.run(request)
    except SandboxRefused as refused:
        return ToolResult.fail(refused.code, refused.message, **refused.detail)
    return _result(outcome)


class BashExec(TypedTool):
    name = "bash_exec"
    description = (
        "Run a bash command in this agent's workspace, sandboxed: no network, nothing outside the workspace "
        "writable. Returns exit code, stdout, stderr (each capped at 1 MiB and marked when truncated), duration "
        "and the sandbox layer it ran at."
    )
    facts = DESTRUCTIVE
    requires = ("sandbox",)

    class Args(ExecArgs):
        command: str = Field(min_length=1, max_length=MAX_SOURCE_CHARS, description="The bash command line.")

    def floor_script(self, args: Args) -> tuple[str, str]:
        return "bash", args.command

    async def call(self, args: Args, ctx: ToolContext) -> ToolResult:
        request = ExecRequest(
            agent_id=ctx.agent_id,
            agent_name=ctx.agent_name,
            language="bash",
            source=args.command,
            working_dir=args.working_dir,
            timeout_s=args.timeout,
        )
        return await _run(self.dependencies["sandbox"], request)


class CodeExec(TypedTool):
    name = "code_exec"
    description = (
        "Run a program (python3, bash, or node where installed) in this agent's workspace, sandboxed like "
        "bash_exec, with the same result."
    )
    facts = DESTRUCTIVE
    requires = ("sandbox",)

    class Args(ExecArgs):
        language: Literal["python3", "bash", "node"] = Field(description="The interpreter.")
        code: str = Field(min_length=1, max_length=MAX_SOURCE_CHARS, description="The program text.")

    def floor_script(self, args: Args) -> tuple[str, str]:
        return args.language, args.code

    async def call(self, args: Args, ctx: ToolContext) -> ToolResult:
        request = ExecRequest(
            agent_id=ctx.agent_id,
            agent_name=ctx.agent_name,
            language=args.language,
            source=args.code,
            working_dir=args.working_dir,
            timeout_s=args.timeout,
        )
        return await _run(self.dependencies["sandbox"], request)
