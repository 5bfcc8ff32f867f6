"""WorkspaceSandbox: the one way tools run commands, at the strongest layer the probe found, in an agent's workspace."""

from __future__ import annotations

import asyncio
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..chokepoint.policy import CommandRules
from ..command_policy import CommandPolicy
from ..policy_store import current_policy, policy_last
from .base import STRONGEST, ExecRequest, ExecResult, Limits, SandboxRefused, Workspace, level_rank
from .engine import Engine, agent_uid, workspace_prepare
from .layers import LAYERS, SANDBOX_PATH
from .paths import PathRefused, open_root, path_parts, walk_dirs
from .probe import ProbeReport, sandbox_probe

# language -> (binary looked up on the sandbox's PATH, the flag that takes the program text)
INTERPRETERS = {"bash": ("bash", "-c"), "python3": ("python3", "-c"), "node": ("node", "-e")}


class WorkspaceSandbox:
    """Runs commands through one layer; refuses everything when the probe found none, or none strong enough."""

    def __init__(
        self,
        *,
        data_dir: Path,
        policy: CommandPolicy,
        report: ProbeReport,
        level: str | None = None,
        limits: Limits | None = None,
        workers: int = 8,
    ):
        self.data_dir = data_dir
        self.root = data_dir / "workspaces"
        self.policy = policy
        self.report = report
        self.limits = limits or Limits()
        self.level = level or report.level
        if level is not None and level not in report.available:
            check = report.check(level)
            raise ValueError(f"the {level} layer does not work here: {check.reason if check else 'unknown layer'}")
        self.degraded = self.level != STRONGEST or report.uid is None
        self.refusal = self._refusal()
        self.engine = None
        if self.refusal is None:
            self.engine = Engine(
                LAYERS[self.level](), limits=self.limits, hidden=(data_dir,), state_dir=data_dir / "sandbox"
            )
        self.interpreters = {
            language: [found, flag]
            for language, (binary, flag) in INTERPRETERS.items()
            if (found := shutil.which(binary, path=SANDBOX_PATH))
        }
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="aleph-sandbox")

    @classmethod
    def start(cls, *, data_dir: Path, min_level: str | None = None) -> WorkspaceSandbox:
        """Probe the layers, then run at the strongest that works, with the floor reading the admin's rules."""
        report = sandbox_probe(data_dir=data_dir, min_level=min_level)
        return cls(data_dir=data_dir, policy=CommandPolicy(rules=_current_rules), report=report)

    def health(self) -> dict[str, Any]:
        return {**self.report.as_dict(), "level": self.level, "languages": list(self.languages())}

    def _refusal(self) -> str | None:
        if self.level == "none":
            return "No sandbox layer works on this machine, so no command runs: " + " ".join(self.report.reasons)
        minimum = self.report.min_level
        if minimum is not None and level_rank(self.level) < level_rank(minimum):
            return (
                f"The sandbox runs at {self.level}, below ALEPH_SANDBOX_MIN_LEVEL={minimum}, so no command runs. "
                + " ".join(r for r in self.report.reasons if not r.startswith("ALEPH_SANDBOX_MIN_LEVEL"))
            ).strip()
        return None

    def languages(self) -> tuple[str, ...]:
        return tuple(self.interpreters)

    def workspace(self, *, agent_id: int, agent_name: str) -> Workspace:
        """The agent's directory, created on demand: named by name and id, as its uid is, so that a later agent
        of the same name never inherits it."""
        uid = agent_uid(agent_id) if self.report.uid is not None else None
        workspace = workspace_prepare(self.root / f"{agent_name}-{agent_id}", uid=uid)
        if self.level == "landlock":
            tmp = workspace.path / ".tmp"
            if not tmp.is_dir():
                tmp.mkdir(mode=0o700, exist_ok=True)
                if uid is not None:
                    os.lchown(tmp, uid, uid)
        return workspace

    async def run(self, request: ExecRequest) -> ExecResult:
        return await asyncio.get_running_loop().run_in_executor(self.executor, self.run_blocking, request)

    def run_blocking(self, request: ExecRequest) -> ExecResult:
        if self.refusal is not None or self.engine is None:
            raise SandboxRefused("sandbox_unavailable", self.refusal or "No sandbox layer is configured.")
        verdict = self.policy.evaluate(language=request.language, text=request.source)
        if verdict.blocked is not None:
            rule = verdict.blocked
            raise SandboxRefused("command_blocked", rule.reason, rule=f"command_policy:{rule.name}")
        interpreter = self.interpreters.get(request.language)
        if interpreter is None:
            raise SandboxRefused(
                "language_unavailable", f"{request.language} is not installed here; try {', '.join(self.languages())}."
            )
        if "\x00" in request.source or len(request.source.encode()) > self.limits.source_bytes:
            raise SandboxRefused(
                "source_too_large", f"The program must be at most {self.limits.source_bytes} bytes, without NUL bytes."
            )
        timeout = min(request.timeout_s or self.limits.timeout_s, self.limits.max_timeout_s)
        workspace = self.workspace(agent_id=request.agent_id, agent_name=request.agent_name)
        cwd = self._working_dir(workspace, request.working_dir)
        captured = self.engine.run(workspace=workspace, cwd=cwd, argv=[*interpreter, request.source], timeout_s=timeout)
        return ExecResult(
            exit_code=captured.exit_code,
            stdout=captured.stdout.decode(errors="replace"),
            stderr=captured.stderr.decode(errors="replace"),
            stdout_truncated=captured.stdout_bytes > len(captured.stdout),
            stderr_truncated=captured.stderr_bytes > len(captured.stderr),
            stdout_bytes=captured.stdout_bytes,
            stderr_bytes=captured.stderr_bytes,
            timed_out=captured.timed_out,
            duration_ms=captured.duration_ms,
            layer=self.level,
            degraded=self.degraded,
            policy_warnings=tuple(rule.name for rule in verdict.warnings),
        )

    @staticmethod
    def _working_dir(workspace: Workspace, working_dir: str) -> Path:
        """A real directory inside the workspace, checked without following symlinks."""
        try:
            parts = path_parts(working_dir)
            root = open_root(str(workspace.path))
            try:
                os.close(walk_dirs(root, parts))
            finally:
                os.close(root)
        except (PathRefused, FileNotFoundError) as exc:
            raise SandboxRefused("bad_working_dir", f"working_dir {working_dir!r}: {exc}") from None
        return workspace.path.joinpath(*parts)


def _current_rules() -> CommandRules:
    """The admin's rules as this process last compiled them: never older than those the floor checked the call with,
    since that policy was compiled for it. Without any yet (no call decided here), the current policy's."""
    return (policy_last() or current_policy()).command_rules
