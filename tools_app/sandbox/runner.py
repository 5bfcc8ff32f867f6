"""Run one launch to completion: bounded output, a wall clock, and no process of it left alive afterwards."""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from .base import SandboxRefused
from .layers import Launch, drop_privileges

READ_CHUNK = 65536
KILL = shutil.which("kill", path="/usr/bin:/bin") or "/bin/kill"
# After the command ended or was killed, how long stragglers' last output may take to arrive.
DRAIN_S = 2.0


@dataclass
class Captured:
    exit_code: int
    stdout: bytes
    stderr: bytes
    stdout_bytes: int
    stderr_bytes: int
    timed_out: bool
    duration_ms: int


class _Stream:
    def __init__(self, fd: int, budget: int):
        self.fd = fd
        self.budget = budget
        self.data = bytearray()
        self.total = 0

    def take(self, chunk: bytes) -> None:
        """Keep the first `budget` bytes and count the rest: the command runs the same whether or not we keep it."""
        self.total += len(chunk)
        room = self.budget - len(self.data)
        if room > 0:
            self.data += chunk[:room]


def kill_as(uid: int, kill_binary: str) -> None:
    """SIGKILL every process of `uid` at once: kill(-1) from that uid reaches setsid'ed descendants too."""
    subprocess.run(
        [*drop_privileges(uid), kill_binary, "-KILL", "--", "-1"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={},
        timeout=10,
        check=False,
    )


def run_launch(launch: Launch, *, timeout_s: float, output_bytes: int, sweep: Callable[[], None]) -> Captured:
    """Run to exit or timeout; `sweep` kills whatever of the command is still alive (its uid, or its group)."""
    started = time.monotonic()
    preexec = None
    report_read = report_write = -1
    if launch.preexec is not None:
        # Popen reports only "Exception occurred in preexec_fn"; the child writes the real reason here first.
        report_read, report_write = os.pipe()
        setup = launch.preexec

        def preexec() -> None:
            try:
                setup()
            except BaseException as exc:
                os.write(report_write, f"{type(exc).__name__}: {exc}".encode()[:2000])
                raise

    try:
        process = subprocess.Popen(
            launch.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=launch.env,
            cwd=launch.cwd,
            start_new_session=True,
            preexec_fn=preexec,
            pass_fds=launch.pass_fds,
            umask=0o022,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
        if report_write >= 0:
            os.close(report_write)
            report_write = -1
            reason = os.read(report_read, 4096).decode(errors="replace") or reason
        raise SandboxRefused("sandbox_failed", f"The sandbox could not start the command: {reason}") from None
    finally:
        for fd in (report_write, report_read):
            if fd >= 0:
                os.close(fd)
        launch.close()
    out = _Stream(process.stdout.fileno(), output_bytes)
    err = _Stream(process.stderr.fileno(), output_bytes)
    streams = {out.fd: out, err.fd: err}
    pidfd = os.pidfd_open(process.pid)
    selector = selectors.DefaultSelector()
    for fd in streams:
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    selector.register(pidfd, selectors.EVENT_READ)
    deadline = started + timeout_s
    timed_out = False
    ended = False

    def stop(*, timeout: bool) -> None:
        """The command ended or ran out of time: kill what is left of it, then drain for a moment."""
        nonlocal ended, deadline, timed_out
        timed_out = timeout
        ended = True
        deadline = time.monotonic() + DRAIN_S
        if timeout:
            _killpg(process.pid)
        sweep()

    try:
        while streams or not ended:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if ended:
                    break
                stop(timeout=True)
                continue
            for key, _ in selector.select(remaining):
                if key.fd == pidfd:
                    selector.unregister(pidfd)
                    if not ended:
                        stop(timeout=False)
                    continue
                chunk = os.read(key.fd, READ_CHUNK)
                if chunk:
                    streams[key.fd].take(chunk)
                else:
                    selector.unregister(key.fd)
                    del streams[key.fd]
    finally:
        if not ended:
            _killpg(process.pid)
            sweep()
        selector.close()
        os.close(pidfd)
        process.stdout.close()
        process.stderr.close()
        try:
            code = process.wait(timeout=DRAIN_S)
        except subprocess.TimeoutExpired:
            _killpg(process.pid)
            code = process.wait()
    return Captured(
        exit_code=code if code >= 0 else 128 - code,
        stdout=bytes(out.data),
        stderr=bytes(err.data),
        stdout_bytes=out.total,
        stderr_bytes=err.total,
        timed_out=timed_out,
        duration_ms=int((time.monotonic() - started) * 1000),
    )


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def uid_processes(uid: int) -> list[int]:
    """Live (not zombie) pids whose real uid is `uid`: how tests and the probe see that nothing of a run survived."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as handle:
                fields = dict(line.split(b":", 1) for line in handle if b":" in line)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if int(fields[b"Uid"].split()[0]) == uid and not fields[b"State"].strip().startswith(b"Z"):
            found.append(int(entry.name))
    return found
