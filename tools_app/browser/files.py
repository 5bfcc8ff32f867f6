"""Files the browser touches: artifacts written into and uploads read from an agent's workspace, and saved profiles."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nacl.exceptions import CryptoError
from nacl.secret import SecretBox

from .errors import BrowserError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
ARTIFACT_DIR = "browser"
MAX_UPLOAD_BYTES = 50 * 1024 * 1024
MAX_PATH_CHARS = 4096
FILENAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

# Given by the wiring: the sandbox's `workspace(agent_id=, agent_name=)` when one is wired; anything with `.path`.
WorkspaceFor = Callable[..., Any]


@dataclass(frozen=True)
class Artifact:
    """A file the browser wrote into the workspace: the model finds it by path, an operator opens its call's url."""

    path: str
    bytes: int
    media_type: str
    sha256: str

    def as_dict(self, *, agent_name: str, call_id: str) -> dict[str, Any]:
        return {
            "path": self.path,
            "uri": f"workspace://{agent_name}/{self.path}",
            "url": f"/browser/artifacts/{call_id}/",
            "bytes": self.bytes,
            "media_type": self.media_type,
            "sha256": self.sha256,
        }


def default_workspaces(root: Path) -> WorkspaceFor:
    """ALEPH_DATA_DIR/workspaces/<agent name>, the sandbox's convention, for when no sandbox is wired."""

    @dataclass(frozen=True)
    class _Workspace:
        path: Path

    def workspace(*, agent_id: int, agent_name: str) -> _Workspace:
        root.mkdir(parents=True, exist_ok=True)
        path = root / agent_name
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        return _Workspace(path)

    return workspace


def workspace_path(workspace_for: WorkspaceFor, *, agent_id: int, agent_name: str) -> Path:
    if not agent_name or "/" in agent_name or agent_name in (".", "..") or "\x00" in agent_name:
        raise BrowserError("workspace_invalid", f"The agent name {agent_name!r} cannot name a workspace.")
    try:
        path = Path(workspace_for(agent_id=agent_id, agent_name=agent_name).path)
    except BrowserError:
        raise
    except Exception as exc:  # the sandbox refuses (a workspace another uid owns, say): say so, do not write
        raise BrowserError("workspace_unavailable", f"The agent's workspace is unavailable: {exc}") from None
    return path


def path_parts(path: str) -> list[str]:
    """A workspace-relative path split into parts; absolute paths, `..` and NUL bytes are refused."""
    if "\x00" in path or len(path) > MAX_PATH_CHARS:
        raise BrowserError("path_refused", "A path may not contain NUL bytes or be longer than 4096 characters.")
    if path.startswith("/"):
        raise BrowserError("path_refused", "Paths are relative to the agent's workspace; absolute paths are refused.")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise BrowserError("path_refused", "`..` is refused: paths stay inside the agent's workspace.")
    if not parts:
        raise BrowserError("path_refused", "The path names no file.")
    return parts


@contextlib.contextmanager
def _opened(path: str | int, flags: int, *, dir_fd: int | None = None, mode: int = 0o777) -> Iterator[int]:
    try:
        fd = os.open(path, flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise BrowserError(
                "path_refused", f"{path!r} is a symlink or not a directory; symlinks are never followed."
            ) from None
        raise
    try:
        yield fd
    finally:
        os.close(fd)


def _walk(root_fd: int, parts: list[str], *, create_uid: tuple[int, int] | None = None) -> int:
    """An fd of the directory `parts` names beneath root_fd, never through a symlink (the caller closes it)."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            if create_uid is not None:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if os.geteuid() == 0:
                        os.chown(part, *create_uid, dir_fd=fd, follow_symlinks=False)
                except FileExistsError:
                    pass
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                raise BrowserError("file_not_found", f"No directory {part!r} in the workspace.") from None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise BrowserError("path_refused", f"{part!r} is a symlink or not a directory.") from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def artifact_write(workspace: Path, *, name: str | None, suffix: str, data: bytes, media_type: str) -> Artifact:
    """Write into <workspace>/browser/, owned like the workspace; an existing name is replaced only if a plain file."""
    if name is None:
        name = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}{suffix}"
    elif not FILENAME.match(name) or not name.endswith(suffix):
        raise BrowserError(
            "path_refused",
            f"A file name is letters, digits, '_', '-' and '.', at most 100 characters, ending {suffix}.",
        )
    with _opened(str(workspace), DIR_FLAGS) as root_fd:
        owner = os.fstat(root_fd)
        directory = _walk(root_fd, [ARTIFACT_DIR], create_uid=(owner.st_uid, owner.st_gid))
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            with _opened(name, flags, dir_fd=directory, mode=0o644) as fd:
                info = os.fstat(fd)
                # A hard link made by the agent would let this write land on a file outside the workspace.
                if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                    raise BrowserError("path_refused", f"{ARTIFACT_DIR}/{name} exists and is not a plain file.")
                os.ftruncate(fd, 0)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if os.geteuid() == 0 and info.st_uid != owner.st_uid:
                    os.fchown(fd, owner.st_uid, owner.st_gid)
        finally:
            os.close(directory)
    return Artifact(f"{ARTIFACT_DIR}/{name}", len(data), media_type, hashlib.sha256(data).hexdigest())


def artifact_read(workspace: Path, path: str) -> bytes:
    """Read back a file the browser wrote: only under browser/, never through a symlink."""
    parts = path_parts(path)
    if len(parts) != 2 or parts[0] != ARTIFACT_DIR:
        raise BrowserError("path_refused", f"{path!r} is not a browser artifact.")
    return upload_read(workspace, path)[1]


def upload_read(workspace: Path, path: str) -> tuple[str, bytes]:
    """Read one file of the workspace for an upload: a plain file, reached without following symlinks."""
    parts = path_parts(path)
    with _opened(str(workspace), DIR_FLAGS) as root_fd:
        directory = _walk(root_fd, parts[:-1])
        try:
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
            except FileNotFoundError:
                raise BrowserError("file_not_found", f"No file {path!r} in the agent's workspace.") from None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise BrowserError("path_refused", f"{path!r} is a symlink; symlinks are never followed.") from None
                raise
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    raise BrowserError("path_refused", f"{path!r} is not a plain file.")
                if info.st_nlink != 1:
                    # Another name for the same file may live outside the workspace.
                    raise BrowserError("path_refused", f"{path!r} has other hard links; copy it instead.")
                if info.st_size > MAX_UPLOAD_BYTES:
                    raise BrowserError("too_large", f"{path!r} is larger than {MAX_UPLOAD_BYTES} bytes.")
                chunks, size = [], 0
                while chunk := os.read(fd, 1024 * 1024):
                    size += len(chunk)
                    if size > MAX_UPLOAD_BYTES:
                        raise BrowserError("too_large", f"{path!r} is larger than {MAX_UPLOAD_BYTES} bytes.")
                    chunks.append(chunk)
            finally:
                os.close(fd)
        finally:
            os.close(directory)
    return parts[-1], b"".join(chunks)


class ProfileStore:
    """Named profiles (cookies and local storage) per agent, encrypted at rest when a box is given."""

    def __init__(self, root: Path, box: SecretBox | None = None):
        self.root = root
        self.box = box
        self.suffix = ".profile" if box is not None else ".json"

    @staticmethod
    def check_name(name: str) -> str:
        if not PROFILE_NAME.match(name):
            raise BrowserError(
                "invalid_profile_name", "A profile name is letters, digits, '_', '-' and '.', at most 64 characters."
            )
        return name

    def _dir(self, agent_id: int) -> Path:
        return self.root / str(agent_id)

    def _file(self, agent_id: int, name: str) -> Path:
        return self._dir(agent_id) / f"{self.check_name(name)}{self.suffix}"

    def list(self, agent_id: int) -> list[dict[str, Any]]:
        directory = self._dir(agent_id)
        if not directory.is_dir():
            return []
        found = []
        for item in sorted(directory.glob(f"*{self.suffix}")):
            info = item.stat()
            modified = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(info.st_mtime))
            found.append({"name": item.name[: -len(self.suffix)], "bytes": info.st_size, "saved_at": modified})
        return found

    def load(self, agent_id: int, name: str) -> dict[str, Any] | None:
        path = self._file(agent_id, name)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return json.loads(self.box.decrypt(raw) if self.box is not None else raw)
        except (CryptoError, ValueError):
            raise BrowserError(
                "profile_unreadable", f"The saved profile {name!r} cannot be read (the server key changed?)."
            ) from None

    def save(self, agent_id: int, name: str, state: dict[str, Any]) -> int:
        path = self._file(agent_id, name)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = json.dumps(state, separators=(",", ":")).encode()
        if self.box is not None:
            data = bytes(self.box.encrypt(data))
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
        return len(data)

    def delete(self, agent_id: int, name: str) -> bool:
        try:
            self._file(agent_id, name).unlink()
        except FileNotFoundError:
            return False
        return True
