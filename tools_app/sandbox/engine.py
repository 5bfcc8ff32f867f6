"""One layer bound to its limits: runs argv in a workspace, serialising per uid where no pid namespace can."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from .base import Limits, SandboxRefused, Workspace
from .layers import Layer
from .runner import KILL, Captured, kill_as, run_launch

# Agents' commands run as UID_BASE + agent id (the probe as UID_BASE itself): a range no login account or
# subordinate-uid allocation uses by convention, so kill(-1) from one of these uids reaches only that agent.
UID_BASE = 1_900_000_000
LOCK_POLL_S = 0.05
HOST_LOCKS = Path("/run/lock/aleph-sandbox")


def agent_uid(agent_id: int) -> int:
    return UID_BASE + agent_id


def lock_dir(state_dir: Path) -> Path:
    """Where per-uid locks live: host-wide when the server may create it, since uids are host-wide too.

    Two gateways on one host (two data directories) still share the probe's uid and agents' uids; a lock in
    /run/lock keeps one's sweep of a uid from meeting the other's command of that uid.
    """
    for candidate in (HOST_LOCKS, state_dir / "locks"):
        try:
            candidate.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError:
            continue
        if os.access(candidate, os.W_OK):
            return candidate
    raise SandboxRefused("sandbox_failed", f"No writable directory for sandbox locks ({HOST_LOCKS}, {state_dir}).")


class Engine:
    def __init__(self, layer: Layer, *, limits: Limits, hidden: tuple[Path, ...], state_dir: Path):
        self.layer = layer
        self.limits = limits
        self.hidden = hidden
        self.locks = lock_dir(state_dir)
        self.kill_binary = KILL

    def run(self, *, workspace: Workspace, cwd: Path, argv: list[str], timeout_s: float) -> Captured:
        uid = workspace.uid
        if self.layer.pid_namespace or uid is None:
            return self._run(workspace, cwd, argv, timeout_s, sweep=lambda: None)
        # Without a pid namespace, "the whole tree" is every process of the agent's uid: one run per uid at a time.
        with self._uid_lock(uid, timeout_s) as remaining:
            return self._run(workspace, cwd, argv, remaining, sweep=lambda: kill_as(uid, self.kill_binary))

    def _run(self, workspace: Workspace, cwd: Path, argv: list[str], timeout_s: float, *, sweep) -> Captured:
        launch = self.layer.launch(workspace=workspace, cwd=cwd, argv=argv, limits=self.limits, hidden=self.hidden)
        return run_launch(launch, timeout_s=timeout_s, output_bytes=self.limits.output_bytes, sweep=sweep)

    @contextlib.contextmanager
    def _uid_lock(self, uid: int, timeout_s: float) -> Iterator[float]:
        started = time.monotonic()
        with open(self.locks / f"{uid}.lock", "a") as lock:
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() - started > timeout_s:
                        raise SandboxRefused(
                            "sandbox_busy", f"Another command of this agent held its sandbox for {timeout_s:g} s."
                        ) from None
                    time.sleep(LOCK_POLL_S)
            yield max(0.1, timeout_s - (time.monotonic() - started))


def workspace_prepare(path: Path, *, uid: int | None) -> Workspace:
    """Create the directory on demand (0700, owned by the agent's uid); refuse one that another uid owns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o711)  # noqa: S103  agents' uids pass through to their own workspace, never list others
    try:
        os.mkdir(path, 0o700)
        if uid is not None:
            os.chown(path, uid, uid)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise SandboxRefused("workspace_invalid", f"The workspace {path} is not a plain directory.")
    if uid is not None and info.st_uid != uid:
        raise SandboxRefused(
            "workspace_conflict",
            f"The workspace {path} belongs to uid {info.st_uid}, not this agent's uid {uid} (the server ran with "
            "another uid setting when it was made); an admin must chown or move it.",
        )
    return Workspace(path=path, uid=uid, gid=uid)
