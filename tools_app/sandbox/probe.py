"""The start-up probe: really run each layer once and record what works here and exactly why the rest do not."""

from __future__ import annotations

import fcntl
import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import LEVELS, STRONGEST, Limits, SandboxRefused, level_rank
from .engine import UID_BASE, Engine, lock_dir, workspace_prepare
from .kernel import KernelFeatureMissing
from .layers import LAYERS, drop_privileges
from .runner import KILL, kill_as, uid_processes

PROBE_TIMEOUT_S = 10.0
SURVIVOR_WAIT_S = 1.0


@dataclass(frozen=True)
class LayerCheck:
    level: str
    ok: bool
    reason: str
    ms: float


@dataclass(frozen=True)
class ProbeReport:
    checks: tuple[LayerCheck, ...]  # strongest first
    uid: int | None
    uid_reason: str
    min_level: str | None = None

    @property
    def available(self) -> tuple[str, ...]:
        return tuple(check.level for check in self.checks if check.ok)

    @property
    def level(self) -> str:
        return self.available[0] if self.available else "none"

    @property
    def degraded(self) -> bool:
        return self.level != STRONGEST or self.uid is None

    @property
    def status(self) -> str:
        if self.level == "none":
            return "unavailable"
        if self.min_level is not None and level_rank(self.level) < level_rank(self.min_level):
            return "refused"
        return "degraded" if self.degraded else "ok"

    @property
    def reasons(self) -> list[str]:
        """Why each layer stronger than the one in use failed, then anything else that weakens it."""
        reasons = []
        for check in self.checks:
            if check.level == self.level:
                break
            reasons.append(f"{check.level}: {check.reason}")
        if self.uid is None:
            reasons.append(self.uid_reason)
        if self.status == "refused":
            reasons.append(f"ALEPH_SANDBOX_MIN_LEVEL={self.min_level} refuses to run commands at {self.level}.")
        return reasons

    def check(self, level: str) -> LayerCheck | None:
        return next((c for c in self.checks if c.level == level), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "status": self.status,
            "degraded": self.degraded,
            "reasons": self.reasons,
            "min_level": self.min_level,
            "uid": self.uid,
            "layers": {c.level: {"ok": c.ok, "reason": c.reason, "ms": round(c.ms, 1)} for c in self.checks},
        }


def _uid_check() -> tuple[int | None, str]:
    if os.geteuid() != 0:
        return None, (
            f"The server runs as uid {os.geteuid()}, not root, so commands run as that uid too: RLIMIT_NPROC "
            "cannot cap them, and without a pid namespace a setsid'ed descendant can outlive its command."
        )
    try:
        subprocess.run(
            [*drop_privileges(UID_BASE), "true"], check=True, timeout=PROBE_TIMEOUT_S, env={}, capture_output=True
        )
    except (OSError, subprocess.SubprocessError, KernelFeatureMissing) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        return None, (
            f"Switching to the unprivileged uid {UID_BASE} failed ({exc} {detail.decode(errors='replace').strip()}), "
            "so commands run as root."
        )
    return UID_BASE, ""


def _survivors(uid: int) -> list[int]:
    deadline = time.monotonic() + SURVIVOR_WAIT_S
    while True:
        left = uid_processes(uid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def _check_layer(level: str, *, data_dir: Path, limits: Limits, uid: int | None) -> LayerCheck:
    started = time.perf_counter()

    def result(ok: bool, reason: str = "") -> LayerCheck:
        return LayerCheck(level, ok, reason, (time.perf_counter() - started) * 1000)

    probe_dir = data_dir / "sandbox" / "probe"
    outside = probe_dir / "outside"
    try:
        workspace = workspace_prepare(probe_dir / "workspace", uid=uid)
        outside.mkdir(exist_ok=True)
        os.chmod(outside, 0o777)  # noqa: S103  only the layer, not file permissions, may stop the escape below
        escape = outside / "escape"
        escape.unlink(missing_ok=True)
        script = (
            "echo aleph-probe-ok; "
            "setsid sleep 30 </dev/null >/dev/null 2>&1 & "
            f"if (echo x > {shlex.quote(str(escape))}) 2>/dev/null; then echo aleph-probe-escaped; fi"
        )
        engine = Engine(LAYERS[level](), limits=limits, hidden=(data_dir,), state_dir=data_dir / "sandbox")
        captured = engine.run(
            workspace=workspace, cwd=workspace.path, argv=["/bin/sh", "-c", script], timeout_s=PROBE_TIMEOUT_S
        )
    except (KernelFeatureMissing, SandboxRefused, OSError, subprocess.SubprocessError) as exc:
        return result(False, str(exc) or type(exc).__name__)
    output = captured.stdout.decode(errors="replace")
    if "aleph-probe-ok" not in output:
        error = captured.stderr.decode(errors="replace").strip()[:500]
        return result(False, f"the probe command failed with exit code {captured.exit_code}: {error}")
    if engine.layer.confines_files and "aleph-probe-escaped" in output:
        return result(False, "a write outside the workspace succeeded")
    if uid is not None and _survivors(uid):
        return result(False, "a setsid'ed child of the probe command outlived it")
    return result(True)


def sandbox_probe(*, data_dir: Path, limits: Limits | None = None, min_level: str | None = None) -> ProbeReport:
    """Run `sh` through every layer, strongest first; all of them, so the report shows what each would give."""
    if min_level is not None and min_level not in LEVELS:
        raise ValueError(f"unknown sandbox level {min_level!r}")
    state = data_dir / "sandbox"
    state.mkdir(parents=True, exist_ok=True)
    # Every server process on this host shares the probe's uid: one probe at a time, each starting clean.
    with open(lock_dir(state) / "probe.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        uid, uid_reason = _uid_check()
        checks = []
        for level in reversed(LEVELS[1:]):
            if uid is not None:
                kill_as(uid, KILL)
            checks.append(_check_layer(level, data_dir=data_dir, limits=limits or Limits(), uid=uid))
    return ProbeReport(checks=tuple(checks), uid=uid, uid_reason=uid_reason, min_level=min_level)
