"""Race-free confinement to a directory: walk from its fd, one O_NOFOLLOW component at a time."""

from __future__ import annotations

import errno
import os

MAX_PATH_CHARS = 4096
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PathRefused(Exception):
    """The path names nothing this agent may touch; the message says why, without echoing anything outside."""


def path_parts(path: str) -> list[str]:
    """Split a workspace-relative path; refuse absolute paths, `..`, NUL bytes and absurd lengths."""
    if "\x00" in path:
        raise PathRefused("A path may not contain a NUL byte.")
    if len(path) > MAX_PATH_CHARS:
        raise PathRefused(f"A path may be at most {MAX_PATH_CHARS} characters long.")
    if path.startswith("/"):
        raise PathRefused("Paths are relative to the workspace; absolute paths are refused.")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise PathRefused("`..` is refused: paths stay inside the workspace.")
    return parts


def open_root(root: str) -> int:
    return os.open(root, DIR_FLAGS)


def walk_dirs(root_fd: int, parts: list[str], *, create: bool = False, uid: int | None = None) -> int:
    """An fd of the directory `parts` names beneath root_fd (a new fd the caller closes); never through a symlink."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
                if uid is not None:
                    os.fchown(child, uid, uid)
            except OSError as exc:
                raise _refusal(exc, part) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refusal(exc: OSError, part: str) -> Exception:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return PathRefused(f"{part!r} is a symlink or not a directory; paths never follow symlinks.")
    return exc
