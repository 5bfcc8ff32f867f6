"""The sandbox: the only package that starts processes; every exec-class tool runs through it."""

from .base import LEVELS, ExecRequest, ExecResult, Limits, Sandbox, SandboxRefused, Workspace, level_rank
from .probe import LayerCheck, ProbeReport, sandbox_probe
from .workspace import WorkspaceSandbox

__all__ = [
    "LEVELS",
    "ExecRequest",
    "ExecResult",
    "LayerCheck",
    "Limits",
    "ProbeReport",
    "Sandbox",
    "SandboxRefused",
    "Workspace",
    "WorkspaceSandbox",
    "level_rank",
    "sandbox_probe",
]
