"""The three layers, strongest first: each turns a command into the argv and child set-up that confine it."""

from __future__ import annotations

import os
import resource
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


@dataclass
class Launch:
    """Everything Popen needs; `close` releases the parent's copies of descriptors handed to the child."""

    argv: list[str]
    env: dict[str, str]
    uid: int | None
    gid: int | None
    preexec: Callable[[], None]
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


def _rlimits(limits: Limits) -> list[tuple[int, tuple[int, int]]]:
    return [
        (resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s)),
        (resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes)),
        (resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes)),
        (resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files)),
        (resource.RLIMIT_NPROC, (limits.processes, limits.processes)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]


def _child_setup(*, limits: Limits, chdir: str | None, extra: Callable[[], None] | None) -> Callable[[], None]:
    """Runs in the child after Popen dropped to the agent's uid: only syscalls on values prepared beforehand."""
    rlimits = _rlimits(limits)

    def setup() -> None:
        if chdir is not None:
            os.chdir(chdir)
        for which, value in rlimits:
            resource.setrlimit(which, value)
        kernel.no_new_privs()
        if extra is not None:
            extra()

    return setup


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

    def launch(self, *, workspace, cwd, argv, limits, hidden):
        return Launch(
            argv=argv,
            env=scrubbed_env(home=workspace.path, tmpdir=TMP),
            uid=workspace.uid,
            gid=workspace.gid,
            preexec=_child_setup(limits=limits, chdir=str(cwd), extra=None),
        )


class LandlockLayer(Layer):
    """Landlock: read-only system directories, the workspace read-write, nothing else; seccomp: no sockets."""

    level = "landlock"
    confines_files = True
    denies_network = True

    def __init__(self) -> None:
        self.abi = kernel.landlock_abi()
        self.seccomp = kernel.SeccompFilter(kernel.network_deny_program())

    def launch(self, *, workspace, cwd, argv, limits, hidden):
        tmp = workspace.path / ".tmp"
        ruleset = kernel.landlock_ruleset(
            abi=self.abi, read=SYSTEM_READ, read_write=(str(workspace.path),), devices=DEVICES
        )
        seccomp = self.seccomp

        def confine() -> None:
            kernel.landlock_restrict_self(ruleset)
            seccomp.install()

        return Launch(
            argv=argv,
            env=scrubbed_env(home=workspace.path, tmpdir=str(tmp)),
            uid=workspace.uid,
            gid=workspace.gid,
            preexec=_child_setup(limits=limits, chdir=str(cwd), extra=confine),
            close=lambda: os.close(ruleset),
        )


class BubblewrapLayer(Layer):
    """bubblewrap: every namespace unshared, / read-only, the server's data hidden, only the workspace writable."""

    level = "bubblewrap"
    pid_namespace = True
    confines_files = True
    denies_network = True

    def __init__(self) -> None:
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
            argv=[*args, "--", *argv],
            env=scrubbed_env(home=workspace.path, tmpdir=TMP),
            uid=workspace.uid,
            gid=workspace.gid,
            preexec=_child_setup(limits=limits, chdir=None, extra=None),
            pass_fds=pass_fds,
            close=close,
        )


LAYERS: dict[str, type[Layer]] = {"bubblewrap": BubblewrapLayer, "landlock": LandlockLayer, "rlimits": RlimitsLayer}
