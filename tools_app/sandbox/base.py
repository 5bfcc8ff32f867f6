"""What every sandbox offers: levels, limits, the request a tool makes and the result it gets back."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

# Weakest first; a level promises everything the levels before it do.
LEVELS = ("none", "rlimits", "landlock", "bubblewrap")
STRONGEST = LEVELS[-1]


def level_rank(level: str) -> int:
    return LEVELS.index(level)


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 60.0
    max_timeout_s: float = 600.0
    output_bytes: int = 1024 * 1024
    cpu_s: int = 600
    memory_bytes: int = 4 * 1024**3
    file_bytes: int = 256 * 1024**2
    open_files: int = 256
    processes: int = 256
    tmp_bytes: int = 256 * 1024**2
    source_bytes: int = 128 * 1024 - 1  # one argv string (MAX_ARG_STRLEN), its NUL excluded


@dataclass(frozen=True)
class ExecRequest:
    """Run `source` in `language` for one agent, in its workspace (or a directory inside it)."""

    agent_id: int
    agent_name: str
    language: str
    source: str
    working_dir: str = "."
    timeout_s: float | None = None


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None  # shell convention on every layer: 128 + N when signal N ended the command
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    stdout_bytes: int
    stderr_bytes: int
    timed_out: bool
    duration_ms: int
    layer: str
    degraded: bool
    policy_warnings: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["policy_warnings"] = list(self.policy_warnings)
        return data


@dataclass(frozen=True)
class Workspace:
    """An agent's directory and the unprivileged uid/gid its commands run as (None: the server's own)."""

    path: Path
    uid: int | None
    gid: int | None


class SandboxRefused(Exception):
    """The sandbox will not run this request; `code` is the tool error code, the message says why."""

    def __init__(self, code: str, message: str, **detail: Any):
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail


class Sandbox(Protocol):
    level: str
    degraded: bool

    def languages(self) -> tuple[str, ...]: ...

    def workspace(self, *, agent_id: int, agent_name: str) -> Workspace: ...

    async def run(self, request: ExecRequest) -> ExecResult: ...
