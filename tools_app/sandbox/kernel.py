"""Landlock and seccomp through ctypes: rulesets and filters built in the parent, applied in the child before exec."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.restype = ctypes.c_int

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

# Syscall numbers that matter here; Landlock's are the same on every architecture.
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1

# Filesystem rights by the Landlock ABI that introduced them.
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_ABI1 = (1 << 13) - 1
FS_REFER = 1 << 13
FS_TRUNCATE = 1 << 14
FS_IOCTL_DEV = 1 << 15
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ_RIGHTS = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR


@dataclass(frozen=True)
class Arch:
    audit: int
    socket: int
    io_uring_setup: int
    x32_bit: int | None


ARCHES = {
    "x86_64": Arch(audit=0xC000003E, socket=41, io_uring_setup=425, x32_bit=0x40000000),
    "aarch64": Arch(audit=0xC00000B7, socket=198, io_uring_setup=425, x32_bit=None),
}


class KernelFeatureMissing(Exception):
    """A kernel feature a layer needs is absent or refused; the message says which and why."""


def _fail(what: str) -> KernelFeatureMissing:
    code = ctypes.get_errno()
    return KernelFeatureMissing(f"{what}: {errno.errorcode.get(code, code)} ({os.strerror(code)})")


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, or KernelFeatureMissing with the errno that says why not."""
    version = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), LANDLOCK_CREATE_RULESET_VERSION)
    if version < 0:
        raise _fail("landlock_create_ruleset")
    return int(version)


def handled_fs_rights(abi: int) -> int:
    rights = FS_ABI1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def landlock_ruleset(*, abi: int, read: Iterable[str], read_write: Iterable[str], devices: Iterable[str]) -> int:
    """A ruleset fd allowing read+execute beneath `read`, everything beneath `read_write`, read/write on `devices`."""
    handled = handled_fs_rights(abi)
    attr = struct.pack("=Q", handled)
    fd = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(len(attr)), 0)
    if fd < 0:
        raise _fail("landlock_create_ruleset")
    try:
        for paths, rights in ((read, READ_RIGHTS), (read_write, handled), (devices, FS_READ_FILE | FS_WRITE_FILE)):
            for path in paths:
                _landlock_allow(fd, path, rights & handled)
    except BaseException:
        os.close(fd)
        raise
    return int(fd)


def _landlock_allow(ruleset_fd: int, path: str, rights: int) -> None:
    try:
        path_fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not stat.S_ISDIR(os.fstat(path_fd).st_mode):
            rights &= FILE_RIGHTS
        rule = struct.pack("=Qi", rights, path_fd)
        if _libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset_fd, LANDLOCK_RULE_PATH_BENEATH, rule, 0) < 0:
            raise _fail(f"landlock_add_rule {path}")
    finally:
        os.close(path_fd)


def no_new_privs() -> None:
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _fail("prctl(PR_SET_NO_NEW_PRIVS)")


def landlock_restrict_self(ruleset_fd: int) -> None:
    if _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset_fd, 0) != 0:
        raise _fail("landlock_restrict_self")


# -- seccomp: no sockets at all (no network, no local services), no io_uring (which can open sockets too) ----------

_BPF_LD_W_ABS = 0x20
_BPF_JEQ_K = 0x15
_BPF_JGE_K = 0x35
_BPF_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO_EPERM = 0x00050000 | errno.EPERM


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def network_deny_program(machine: str | None = None) -> bytes:
    """A classic-BPF seccomp program: socket() and io_uring_setup() fail with EPERM; foreign ABIs are killed."""
    name = machine or platform.machine()
    arch = ARCHES.get(name)
    if arch is None:
        raise KernelFeatureMissing(f"no seccomp network filter for the {name} architecture")
    # Each (opcode, value) denies when it matches: condition i of n jumps over the n-1-i after it and the allow.
    conditions = [(_BPF_JEQ_K, arch.socket), (_BPF_JEQ_K, arch.io_uring_setup)]
    if arch.x32_bit is not None:
        conditions.insert(0, (_BPF_JGE_K, arch.x32_bit))
    program = [
        _insn(_BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        _insn(_BPF_JEQ_K, 1, 0, arch.audit),
        _insn(_BPF_RET_K, 0, 0, _RET_KILL_PROCESS),
        _insn(_BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    count = len(conditions)
    program += [_insn(op, count - i, 0, value) for i, (op, value) in enumerate(conditions)]
    program += [_insn(_BPF_RET_K, 0, 0, _RET_ALLOW), _insn(_BPF_RET_K, 0, 0, _RET_ERRNO_EPERM)]
    return b"".join(program)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class SeccompFilter:
    """A program kept in memory the child can install with one prctl after fork."""

    def __init__(self, program: bytes):
        self.program = program
        self._buffer = ctypes.create_string_buffer(program, len(program))
        self._fprog = _SockFprog(len(program) // 8, ctypes.addressof(self._buffer))

    def install(self) -> None:
        if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(self._fprog), 0, 0) != 0:
            raise _fail("prctl(PR_SET_SECCOMP)")
