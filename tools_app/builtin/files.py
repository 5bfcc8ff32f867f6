"""file_ops: one tool for an agent's workspace files, every path walked from the workspace's fd without symlinks."""

from __future__ import annotations

import asyncio
import errno
import fnmatch
import os
import shutil
import stat
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field, model_validator

from ..chokepoint.base import MUTATING, READ_ONLY, ToolArgs, ToolContext, ToolFacts, ToolResult, TypedTool
from ..sandbox import SandboxRefused, Workspace
from ..sandbox.paths import PathRefused, open_root, path_parts, walk_dirs

MAX_READ_BYTES = 1024 * 1024
MAX_WRITE_BYTES = 1024 * 1024
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_LIST_ENTRIES = 1000
MAX_SEARCH_FILES = 5000
MAX_SEARCH_MATCHES = 200
FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

READING = frozenset({"read", "list", "stat", "search"})
DESTRUCTIVE_OPERATIONS = frozenset({"delete", "move"})


class Refused(Exception):
    def __init__(self, code: str, message: str, **detail: Any):
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail


class FileOps(TypedTool):
    name = "file_ops"
    description = (
        "Files in this agent's workspace: read, write, append, list, stat, mkdir, search (by name and content), "
        "copy, move, delete. Paths are relative to the workspace; symlinks, hard links and `..` are refused. "
        f"Reads and writes are capped at {MAX_READ_BYTES // 1024} KiB."
    )
    # Facts depend on the operation (facts_for): reads are read-only, delete and move are destructive.
    facts = MUTATING
    requires = ("sandbox",)

    class Args(ToolArgs):
        operation: Literal["read", "write", "append", "list", "stat", "mkdir", "search", "copy", "move", "delete"]
        path: str = Field(default=".", max_length=4096, description="A path relative to the workspace.")
        content: str | None = Field(default=None, max_length=MAX_WRITE_BYTES, description="For write and append.")
        destination: str | None = Field(default=None, max_length=4096, description="For copy and move.")
        query: str | None = Field(
            default=None, min_length=1, max_length=500, description="For search: a name glob or text to find."
        )

        @model_validator(mode="after")
        def _needs(self):
            if self.operation in ("write", "append") and self.content is None:
                raise ValueError(f"{self.operation} needs content")
            if self.operation in ("copy", "move") and self.destination is None:
                raise ValueError(f"{self.operation} needs a destination")
            if self.operation == "search" and self.query is None:
                raise ValueError("search needs a query")
            return self

    def asks_for_arguments(self, args: Args) -> bool:
        return args.operation in DESTRUCTIVE_OPERATIONS

    def facts_for(self, args: Args) -> ToolFacts | None:
        if args.operation in READING:
            return READ_ONLY
        return super().facts_for(args)

    async def call(self, args: Args, ctx: ToolContext) -> ToolResult:
        try:
            workspace = self.dependencies["sandbox"].workspace(agent_id=ctx.agent_id, agent_name=ctx.agent_name)
            return ToolResult.ok(await asyncio.to_thread(file_operation, workspace, args))
        except SandboxRefused as refused:
            return ToolResult.fail(refused.code, refused.message)
        except Refused as refused:
            return ToolResult.fail(refused.code, refused.message, **refused.detail)
        except PathRefused as refused:
            return ToolResult.fail("path_refused", str(refused), path=args.path)
        except FileNotFoundError:
            return ToolResult.fail("not_found", f"Nothing named {args.path!r} in the workspace.")
        except FileExistsError:
            return ToolResult.fail("exists", f"{args.destination or args.path!r} already exists.")
        except OSError as exc:
            return ToolResult.fail("os_error", os.strerror(exc.errno) if exc.errno else str(exc), path=args.path)


def file_operation(workspace: Workspace, args: FileOps.Args) -> dict[str, Any]:
    root = open_root(str(workspace.path))
    try:
        return OPERATIONS[args.operation](root, workspace.uid, args)
    finally:
        os.close(root)


# -- helpers ------------------------------------------------------------------------------------------------------


def _entry(root: int, path: str, *, create_parents: bool = False, uid: int | None = None) -> tuple[int, str]:
    """(fd of the parent directory, final name) for a path that names something below the workspace root."""
    parts = path_parts(path)
    if not parts:
        raise Refused("path_refused", "This operation needs a path below the workspace, not the workspace itself.")
    return walk_dirs(root, parts[:-1], create=create_parents, uid=uid), parts[-1]


def _open_regular(parent: int, name: str, flags: int, mode: int = 0o644) -> tuple[int, os.stat_result]:
    """Open without following a symlink; refuse anything but a regular file with exactly one link."""
    try:
        fd = os.open(name, flags | FILE_FLAGS, mode, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathRefused(f"{name!r} is a symlink; file_ops never follows symlinks.") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise Refused("not_a_file", f"{name!r} is not a regular file.")
    if info.st_nlink > 1:
        os.close(fd)
        raise PathRefused(f"{name!r} has {info.st_nlink} hard links; file_ops refuses hard-linked files.")
    return fd, info


def _read_all(fd: int, limit: int) -> bytes:
    chunks, total = [], 0
    while total <= limit:
        chunk = os.read(fd, min(1024 * 1024, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _own(fd: int, info: os.stat_result, uid: int | None) -> None:
    """Files the gateway writes belong to the agent's uid, so its commands can change them too."""
    if uid is not None and (info.st_uid != uid or info.st_gid != uid):
        os.fchown(fd, uid, uid)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


# -- operations ---------------------------------------------------------------------------------------------------


def _read(root: int, uid: int | None, args: FileOps.Args) -> dict[str, Any]:
    parent, name = _entry(root, args.path)
    try:
        fd, info = _open_regular(parent, name, os.O_RDONLY)
    finally:
        os.close(parent)
    try:
        if info.st_size > MAX_READ_BYTES:
            raise Refused(
                "too_large", f"{args.path!r} is {info.st_size} bytes; file_ops reads at most {MAX_READ_BYTES}."
            )
        data = _read_all(fd, MAX_READ_BYTES)
    finally:
        os.close(fd)
    if len(data) > MAX_READ_BYTES:
        raise Refused("too_large", f"{args.path!r} grew past {MAX_READ_BYTES} bytes while being read.")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise Refused("not_text", f"{args.path!r} is not UTF-8 text ({len(data)} bytes).") from None
    return {"path": args.path, "content": text, "bytes": len(data)}


def _write(root: int, uid: int | None, args: FileOps.Args, *, append: bool = False) -> dict[str, Any]:
    data = (args.content or "").encode()
    if len(data) > MAX_WRITE_BYTES:
        raise Refused("too_large", f"content is {len(data)} bytes; file_ops writes at most {MAX_WRITE_BYTES}.")
    parent, name = _entry(root, args.path, create_parents=True, uid=uid)
    try:
        # No O_TRUNC: a hard-linked or special file must be refused before anything of it changes.
        fd, info = _open_regular(parent, name, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else 0))
    finally:
        os.close(parent)
    try:
        if append and info.st_size + len(data) > MAX_FILE_BYTES:
            raise Refused("too_large", f"{args.path!r} would grow past {MAX_FILE_BYTES} bytes.")
        _own(fd, info, uid)
        if not append:
            os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    return {"path": args.path, "bytes_written": len(data), "size": size}


def _append(root: int, uid: int | None, args: FileOps.Args) -> dict[str, Any]:
    return _write(root, uid, args, append=True)


def _list(root: int, uid: int | None, args: FileOps.Args) -> dict[str, Any]:
    directory = walk_dirs(root, path_parts(args.path))
    entries = []
    try:
        with os.scandir(directory) as found:
            for item in found:
                info = item.stat(follow_symlinks=False)
                entries.append({"name": item.name, "type": _kind(info.st_mode), "size": info.st_size})
    finally:
        os.close(directory)
    entries.sort(key=lambda e: e["name"])
    return {
        "path": args.path,
        "entries": entries[:MAX_LIST_ENTRIES],
        "count": len(entries),
        "truncated": len(entries) > MAX_LIST_ENTRIES,
    }


def _stat(root: int, uid: int | None, args: FileOps.Args) -> dict[str, Any]:
    parts = path_parts(args.path)
    if parts:
        parent = walk_dirs(root, parts[:-1])
        try:
            info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(parent)
    else:
        info = os.fstat(root)
    return {
        "path": args.path,
        "type": _kind(info.st_mode),
        "size": info.st_size,
        "mode": oct(stat.S_IMODE(info.st_mode)),
        "links": info.st_nlink,
        "modified": datetime.fromtimestamp(info.st_mtime, UTC).isoformat(),
    }


def _mkdir(root: int, uid: int | None, args: FileOps.Args) -> dict[str, Any]:
    parts = path_parts(args.path)
    if not parts:
        raise Refused("path_refused", "mkdir needs a path below the workspace.")
    os.close(walk_dirs(root, parts, create=True, uid=uid))
    return {"path": args.path, "type": "directory"}


def _search(root: int, uid: int | None, args: FileOps.Args) -> dict[str, Any]:
    query = args.query or ""
    needle = query.lower().encode()
    glob = any(c in query for c in "*?[")
    base = "/".join(path_parts(args.path))
    start = walk_dirs(root, path_parts(args.path))
    matches: list[dict[str, Any]] = []
    scanned = 0
    truncated = False
    try:
        for dirpath, _dirs, files, dir_fd in os.fwalk(".", dir_fd=start, follow_symlinks=False):
            for name in sorted(files):
                if scanned >= MAX_SEARCH_FILES or len(matches) >= MAX_SEARCH_MATCHES:
                    truncated = True
                    break
                scanned += 1
                relative = os.path.normpath(os.path.join(base, dirpath, name))
                if fnmatch.fnmatch(name, query) if glob else query.lower() in name.lower():
                    matches.append({"path": relative, "match": "name"})
                    continue
                if not glob:
                    found = _content_match(dir_fd, name, needle)
                    if found is not None:
                        matches.append({"path": relative, "match": "content", "line": found[0], "text": found[1]})
            if truncated:
                break
    finally:
        os.close(start)
    return {"path": args.path, "query": query, "matches": matches, "scanned": scanned, "truncated": truncated}


def _content_match(dir_fd: int, name: str, needle: bytes) -> tuple[int, str] | None:
    try:
        fd, info = _open_regular(dir_fd, name, os.O_RDONLY)
    except (OSError, PathRefused, Refused):
        return None
    try:
        if info.st_size > MAX_READ_BYTES:
            return None
        data = _read_all(fd, MAX_READ_BYTES)
    finally:
        os.close(fd)
    at = data.lower().find(needle)
    if at < 0:
        return None
    line_start = data.rfind(b"\n", 0, at) + 1
    line_end = data.find(b"\n", at)
    line = data[line_start : line_end if line_end >= 0 else len(data)]
    return data.count(b"\n", 0, at) + 1, line[:200].decode(errors="replace")


def _copy(root: int, uid: int | None, args: FileOps.Args) -> dict[str, Any]:
    parent, name = _entry(root, args.path)
    try:
        source, info = _open_regular(parent, name, os.O_RDONLY)
    finally:
        os.close(parent)
    try:
        if info.st_size > MAX_FILE_BYTES:
            raise Refused("too_large", f"{args.path!r} is larger than {MAX_FILE_BYTES} bytes.")
        target_parent, target_name = _entry(root, args.destination or "", create_parents=True, uid=uid)
        try:
            target = os.open(
                target_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o644, dir_fd=target_parent
            )
        finally:
            os.close(target_parent)
        try:
            _own(target, os.fstat(target), uid)
            copied = 0
            while copied <= MAX_FILE_BYTES:
                sent = os.sendfile(target, source, None, 1024 * 1024)
                if sent == 0:
                    break
                copied += sent
        finally:
            os.close(target)
    finally:
        os.close(source)
    return {"path": args.path, "destination": args.destination, "bytes": copied}


def _move(root: int, uid: int | None, args: FileOps.Args) -> dict[str, Any]:
    parent, name = _entry(root, args.path)
    try:
        target_parent, target_name = _entry(root, args.destination or "", create_parents=True, uid=uid)
        try:
            _movable(parent, name)
            try:
                os.stat(target_name, dir_fd=target_parent, follow_symlinks=False)
            except FileNotFoundError:
                pass
            else:
                raise FileExistsError(args.destination)
            os.rename(name, target_name, src_dir_fd=parent, dst_dir_fd=target_parent)
        finally:
            os.close(target_parent)
    finally:
        os.close(parent)
    return {"path": args.path, "destination": args.destination}


def _movable(parent: int, name: str) -> os.stat_result:
    info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode):
        raise PathRefused(f"{name!r} is a symlink; file_ops never touches symlinks.")
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        raise Refused("not_a_file", f"{name!r} is neither a regular file nor a directory.")
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        raise PathRefused(f"{name!r} has {info.st_nlink} hard links; file_ops refuses hard-linked files.")
    return info


def _delete(root: int, uid: int | None, args: FileOps.Args) -> dict[str, Any]:
    parent, name = _entry(root, args.path)
    try:
        info = _movable(parent, name)
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(name, dir_fd=parent)
            kind = "directory"
        else:
            os.unlink(name, dir_fd=parent)
            kind = "file"
    finally:
        os.close(parent)
    return {"path": args.path, "deleted": kind}


OPERATIONS = {
    "read": _read,
    "write": _write,
    "append": _append,
    "list": _list,
    "stat": _stat,
    "mkdir": _mkdir,
    "search": _search,
    "copy": _copy,
    "move": _move,
    "delete": _delete,
}
