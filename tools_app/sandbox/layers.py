"""The three layers, strongest first: each turns a command into the argv and child set-up that confine it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import kernel
from .base import Limits, Workspace

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
# What a command may read (and execute) on the Landlock layer; the server's data directory is never among them.
SYSTEM_READ = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc", "/sys")
# The rlimits layer's commands share the system /tmp (sticky, per-uid files); bubblewrap mounts a private tmpfs there.
TMP = "/tmp"  # noqa: S108
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
SETPRIV = shutil.which("setpriv", path="/usr/bin:/bin")
PRLIMIT = shutil.which("prlimit", path="/usr/bin:/bin")


@dataclass
class Launch:
    """Everything Popen needs; `close` releases the parent's copies of descriptors handed to the child."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path | None = None
    preexec: Callable[[], None] | None = None
    pass_fds: tuple[int, ...] = ()
    close: Callable[[], None] = field(default=lambda: None)


def scrubbed_env(*, home: Path, tmpdir: str) -> dict[str, str]:
    """A fixed environment: nothing of the server's own environment (tokens, database URLs) reaches a command."""
    return {
        "PATH": SANDBOX_PATH,
        "HOME": str(home),
        "TMPDIR": tmpdir,
        "LANG": "C.UTF-8",
        "TERM": "dumb",
    }


def drop_privileges(uid: int | None) -> list[str]:
    """setpriv to the agent's uid (when the server may switch), no new privileges: an argv prefix, not a fork.

    Changing uid or running a preexec_fn makes Python fork() the whole server; exec'ing setpriv and prlimit keeps
    the cheap vfork() path.
    """
    if SETPRIV is None or PRLIMIT is None:
        raise kernel.KernelFeatureMissing("setpriv and prlimit (util-linux) are needed to drop to an unprivileged uid")
    args = [SETPRIV]
    if uid is not None:
        args += [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    return [*args, "--nnp", "--"]


def rlimits(limits: Limits) -> list[str]:
    return [
        PRLIMIT or "prlimit",
        f"--cpu={limits.cpu_s}",
        f"--as={limits.memory_bytes}",
        f"--fsize={limits.file_bytes}",
        f"--nofile={limits.open_files}",
        f"--nproc={limits.processes}",
        "--core=0",
        "--",
    ]


class Layer:
    level: str
    pid_namespace = False
    confines_files = False
    denies_network = False

    def launch(
        self, *, workspace: Workspace, cwd: Path, argv: list[str], limits: Limits, hidden: tuple[Path, ...]
    ) -> Launch:
        raise NotImplementedError


class RlimitsLayer(Layer):
    """An unprivileged uid, rlimits, no new privileges and a session of its own: no filesystem or network walls."""

    level = "rlimits"

    def __init__(self) -> None:
        drop_privileges(None)

    def launch(self, *, workspace, cwd, argv, limits, hidden):
        return Launch(
            argv=[*drop_privileges(workspace.uid), *rlimits(limits), *argv],
            env=scrubbed_env(home=workspace.path, tmpdir=TMP),
            cwd=cwd,
        )


class LandlockLayer(Layer):
    """Landlock: read-only system directories, the workspace read-write, nothing else; seccomp: no sockets."""

    level = "landlock"
    confines_files = True
    denies_network = True

    def __init__(self) -> None:
        drop_privileges(None)
        self.abi = kernel.landlock_abi()
        self.seccomp = kernel.SeccompFilter(kernel.network_deny_program())

    def launch(self, *, workspace, cwd, argv, limits, hidden):
        ruleset = kernel.landlock_ruleset(
            abi=self.abi, read=SYSTEM_READ, read_write=(str(workspace.path),), devices=DEVICES
        )
        seccomp = self.seccomp

        def confine() -> None:
            # In the forked child, before setpriv: only syscalls on values prepared in the parent.
            kernel.no_new_privs()
            kernel.landlock_restrict_self(ruleset)
            seccomp.install()

        return Launch(
            argv=[*drop_privileges(workspace.uid), *rlimits(limits), *argv],
            env=scrubbed_env(home=workspace.path, tmpdir=str(workspace.path / ".tmp")),
            cwd=cwd,
            preexec=confine,
            close=lambda: os.close(ruleset),
        )


class BubblewrapLayer(Layer):
    """bubblewrap: every namespace unshared, / read-only, the server's data hidden, only the workspace writable."""

    level = "bubblewrap"
    pid_namespace = True
    confines_files = True
    denies_network = True

    def __init__(self) -> None:
        drop_privileges(None)
        found = shutil.which("bwrap")
        if found is None:
            raise kernel.KernelFeatureMissing("bwrap is not installed (Debian package bubblewrap)")
        self.bwrap = found
        try:
            self.seccomp: bytes | None = kernel.network_deny_program()
        except kernel.KernelFeatureMissing:
            self.seccomp = None

    def launch(self, *, workspace, cwd, argv, limits, hidden):
        args = [self.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        args += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        args += ["--size", str(limits.tmp_bytes), "--tmpfs", TMP]
        if os.path.isdir("/run"):
            args += ["--tmpfs", "/run"]
        for path in hidden:
            args += ["--size", str(1024 * 1024), "--tmpfs", str(path)]
        args += ["--bind", str(workspace.path), str(workspace.path), "--chdir", str(cwd)]
        pass_fds: tuple[int, ...] = ()
        close: Callable[[], None] = lambda: None  # noqa: E731
        if self.seccomp is not None:
            program = os.memfd_create("aleph-seccomp", os.MFD_CLOEXEC)
            os.write(program, self.seccomp)
            os.lseek(program, 0, os.SEEK_SET)
            args += ["--seccomp", str(program)]
            pass_fds = (program,)
            close = lambda: os.close(program)  # noqa: E731
        return Launch(
            argv=[*drop_privileges(workspace.uid), *rlimits(limits), *args, "--", *argv],
            env=scrubbed_env(home=workspace.path, tmpdir=TMP),
            pass_fds=pass_fds,
            close=close,
        )


LAYERS: dict[str, type[Layer]] = {"bubblewrap": BubblewrapLayer, "landlock": LandlockLayer, "rlimits": RlimitsLayer}
