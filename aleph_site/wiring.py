"""The one place that wires the registry, the approval desk, the ledger recorder and the floors together."""

from django.conf import settings

from approvals_app.desk import ApprovalDesk
from ledger_app.browse import chains_overview
from ledger_app.recorder import LedgerRecorder
from tools_app.browser import BrowserRuntime
from tools_app.builtin import builtin_tools
from tools_app.chokepoint.registry import ToolRegistry
from tools_app.crypto import secret_box
from tools_app.gateway import Gateway
from tools_app.mcp.wiring import mcp_manager_attach
from tools_app.net.client import Outbound
from tools_app.net.store import network_allow_current
from tools_app.sandbox import WorkspaceSandbox


def build_gateway() -> Gateway:
    registry = ToolRegistry()
    outbound = Outbound(allow_source=network_allow_current)
    sandbox = WorkspaceSandbox.start(data_dir=settings.DATA_DIR, min_level=settings.SANDBOX_MIN_LEVEL)
    browser = BrowserRuntime.from_settings(
        outbound=outbound, profile_box=secret_box(b"aleph-browser"), workspace_for=sandbox.workspace
    )
    registry.register_all(
        builtin_tools(vault_box=secret_box(b"aleph-vault"), outbound=outbound, sandbox=sandbox, browser=browser)
    )
    mcp_manager_attach(registry=registry, outbound=outbound)
    return Gateway(
        registry=registry.freeze(),
        gate=ApprovalDesk(registry=registry),
        recorder=LedgerRecorder(),
        floors=(sandbox.policy,),
        health={"sandbox": sandbox.health()},
        dashboard={"chains": chains_overview},
    )
