"""The browser tools: one small typed tool per action, elements targeted by snapshot refs or coordinates."""

from __future__ import annotations

import asyncio
import json
import mimetypes
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from ..browser.errors import BrowserError
from ..browser.files import artifact_write, upload_read
from ..browser.runtime import BrowserRuntime
from ..browser.session import BrowserSession, Tab, Who
from ..chokepoint.base import DESTRUCTIVE, MUTATING, READ_ONLY, ToolArgs, ToolContext, ToolFacts, ToolResult, TypedTool
from ..net.guard import SsrfBlocked, url_parse

REF_PATTERN = r"^[A-Za-z0-9]{1,32}$"
TAB_PATTERN = r"^t[0-9]{1,6}$"
MAX_SNAPSHOT_CHARS = 200_000
MAX_RESULT_CHARS = 100_000
Modifier = Literal["Alt", "Control", "Meta", "Shift"]


class TabArgs(ToolArgs):
    tab_id: str | None = Field(default=None, pattern=TAB_PATTERN)
    """The tab to use (ids come from browser_tabs and browser_open); the current tab when omitted."""


class TargetArgs(TabArgs):
    """An element named by a ref from the latest browser_snapshot, or failing that a point in the viewport."""

    ref_id: str | None = Field(default=None, pattern=REF_PATTERN)
    """The element's ref from the latest browser_snapshot of this tab, e.g. "e12"."""
    x: float | None = Field(default=None, ge=0)
    """Viewport x coordinate in CSS pixels, used with y when the element has no ref."""
    y: float | None = Field(default=None, ge=0)
    """Viewport y coordinate in CSS pixels, used with x when the element has no ref."""

    target_required: ClassVar[bool] = True

    @model_validator(mode="after")
    def _one_target(self):
        point = (self.x is not None) + (self.y is not None)
        if point == 1:
            raise ValueError("give both x and y, or neither")
        if self.ref_id is not None and point:
            raise ValueError("give either ref_id or x and y, not both")
        if self.target_required and self.ref_id is None and not point:
            raise ValueError("name the element: ref_id from browser_snapshot, or x and y")
        return self

    @property
    def has_target(self) -> bool:
        return self.ref_id is not None or self.x is not None


class BrowserTool(TypedTool):
    """Runs its action in the calling agent's session, on the browser runtime's loop."""

    requires = ("browser",)
    read_only_actions: ClassVar[frozenset[str]] = frozenset()

    def facts_for(self, args: Any) -> ToolFacts | None:
        if getattr(args, "action", None) in self.read_only_actions:
            return READ_ONLY
        return super().facts_for(args)

    async def call(self, args: Any, ctx: ToolContext) -> ToolResult:
        runtime: BrowserRuntime = self.dependencies["browser"]
        who = Who(ctx.agent_id, ctx.agent_name, ctx.session_key or "")
        facts = self.facts_for(args)
        try:
            output = await runtime.run(
                who, lambda session: self.act(runtime, session, args, ctx), persist=not (facts and facts.idempotent)
            )
        except BrowserError as exc:
            return ToolResult.fail(exc.code, exc.message, **exc.detail)
        except SsrfBlocked as exc:
            return ToolResult.fail("ssrf_blocked", str(exc), **exc.detail())
        return ToolResult.ok(output)

    async def act(
        self, runtime: BrowserRuntime, session: BrowserSession, args: Any, ctx: ToolContext
    ) -> dict[str, Any]:
        raise NotImplementedError


def _page_tab(session: BrowserSession, args: TabArgs) -> Tab:
    """The tab an action works on; a tab paused by a dialog cannot act until the dialog is answered."""
    tab = session.tab(args.tab_id)
    tab.ensure_no_dialog()
    return tab


def _url_check(url: str) -> str:
    """Only http(s) URLs are opened; the engine judges the host when the browser asks for it."""
    return url_parse(url).url


async def _on_target(session: BrowserSession, tab: Tab, args: TargetArgs, *, on_ref, on_point) -> Any:
    if args.ref_id is not None:
        locator = await session.locate(tab, args.ref_id)
        return await session.act(tab, lambda: on_ref(locator))
    session.point_check(tab, args.x, args.y)
    return await session.act(tab, lambda: on_point(args.x, args.y))


async def _point_of(session: BrowserSession, tab: Tab, ref: str | None, x: float | None, y: float | None):
    if ref is not None:
        return await session.center(tab, ref)
    session.point_check(tab, x, y)
    return x, y


def _json_safe(value: Any) -> tuple[Any, bool]:
    text = json.dumps(value, default=str, ensure_ascii=False)
    if len(text) <= MAX_RESULT_CHARS:
        return json.loads(text), False
    return text[:MAX_RESULT_CHARS], True


# -- pages and navigation ---------------------------------------------------------------------


class BrowserOpen(BrowserTool):
    name = "browser_open"
    description = (
        "Open an http(s) URL in a new tab of your browser session and make it the current tab. Every request the "
        "page makes passes the same checks as web_fetch: private, loopback and metadata addresses are blocked. "
        "Returns the tab id, final URL and title; take a browser_snapshot next to see the page."
    )
    facts = MUTATING

    class Args(ToolArgs):
        url: str = Field(min_length=1, max_length=8192)
        """The http or https URL to open."""

    async def act(self, runtime, session, args, ctx):
        url = _url_check(args.url)
        tab = await session.tab_new()
        try:
            state = await session.goto(tab, url)
        except Exception:
            await tab.page.close()
            raise
        return {**state, "tabs": len(session.tabs)}


class BrowserNavigate(BrowserTool):
    name = "browser_navigate"
    description = (
        "Navigate the current (or given) tab: to a URL, or back, forward, or reload. Refs from earlier snapshots "
        "stop working after a navigation."
    )
    facts = MUTATING

    class Args(TabArgs):
        url: str | None = Field(default=None, min_length=1, max_length=8192)
        """The http or https URL to load in the tab."""
        action: Literal["back", "forward", "reload"] | None = None
        """Instead of a URL: go back or forward in the tab's history, or reload it."""

        @model_validator(mode="after")
        def _one(self):
            if (self.url is None) == (self.action is None):
                raise ValueError("give either url or action")
            return self

    async def act(self, runtime, session, args, ctx):
        tab = _page_tab(session, args)
        if args.url is not None:
            return await session.goto(tab, _url_check(args.url))
        mark = tab.requested
        move = {"back": tab.page.go_back, "forward": tab.page.go_forward, "reload": tab.page.reload}[args.action]
        failure = None
        try:
            response = await move(wait_until="load")
        except Exception as exc:  # judged by navigation_check: a refusal by the engine is reported as such
            failure, response = exc, None
        if failure is None:
            await session.settle(tab, mark, grace=False)
        session.navigation_check(tab, mark, failure)
        state = await session.state(tab)
        if response is None and args.action != "reload" and tab.requested == mark:
            state["note"] = f"There was no page to go {args.action} to."
        return state


class BrowserSnapshot(BrowserTool):
    name = "browser_snapshot"
    description = (
        "The page's accessibility tree as YAML, with a ref for every element you can act on, e.g. "
        '`- button "Save" [ref=e7]`. Pass those refs as ref_id to browser_click, browser_type and the other '
        "element tools. Refs belong to this snapshot: after the page changes, take a new one."
    )
    facts = READ_ONLY

    class Args(TabArgs):
        depth: int | None = Field(default=None, ge=1, le=100)
        """Limit the tree to this many levels."""

    async def act(self, runtime, session, args, ctx):
        tab = session.tab(args.tab_id)
        if tab.dialog is not None:
            return {**await session.state(tab), "snapshot": None}
        text = await session.snapshot(tab, depth=args.depth)
        state = await session.state(tab)
        truncated = len(text) > MAX_SNAPSHOT_CHARS
        return {
            **state,
            "snapshot": text[:MAX_SNAPSHOT_CHARS],
            "refs": len(tab.refs),
            "truncated": truncated,
        }


# -- elements ---------------------------------------------------------------------------------


class BrowserClick(BrowserTool):
    name = "browser_click"
    description = "Click an element by its ref from browser_snapshot, or a point (x, y) in the viewport."
    facts = MUTATING

    class Args(TargetArgs):
        button: Literal["left", "right", "middle"] = "left"
        """Which mouse button."""
        double: bool = False
        """Double-click instead of a single click."""
        modifiers: list[Modifier] = Field(default_factory=list, max_length=4)
        """Keys held during the click."""

    async def act(self, runtime, session, args, ctx):
        tab = _page_tab(session, args)
        count = 2 if args.double else 1

        async def on_point(x, y):
            for key in args.modifiers:
                await tab.page.keyboard.down(key)
            try:
                await tab.page.mouse.click(x, y, button=args.button, click_count=count)
            finally:
                for key in reversed(args.modifiers):
                    await tab.page.keyboard.up(key)

        await _on_target(
            session,
            tab,
            args,
            on_ref=lambda loc: loc.click(button=args.button, click_count=count, modifiers=args.modifiers or None),
            on_point=on_point,
        )
        return await session.state(tab)


class BrowserType(BrowserTool):
    name = "browser_type"
    description = (
        "Type text into an editable element (by ref, or by clicking a point first). By default the element's "
        "content is replaced; slowly=true types key by key so the page sees each keystroke. submit=true presses "
        "Enter afterwards."
    )
    facts = MUTATING

    class Args(TargetArgs):
        text: str = Field(max_length=100_000)
        """The text to type."""
        submit: bool = False
        """Press Enter after typing."""
        slowly: bool = False
        """Type one character at a time (fires key events) instead of filling the value at once."""

    async def act(self, runtime, session, args, ctx):
        tab = _page_tab(session, args)
        keyboard = tab.page.keyboard

        async def on_ref(locator):
            if args.slowly:
                await locator.press_sequentially(args.text)
            else:
                await locator.fill(args.text)
            if args.submit:
                await locator.press("Enter")

        async def on_point(x, y):
            await tab.page.mouse.click(x, y)
            await (keyboard.type(args.text) if args.slowly else keyboard.insert_text(args.text))
            if args.submit:
                await keyboard.press("Enter")

        await _on_target(session, tab, args, on_ref=on_ref, on_point=on_point)
        return await session.state(tab)


class FormField(ToolArgs):
    ref_id: str = Field(pattern=REF_PATTERN)
    """The field's ref from browser_snapshot."""
    value: str | bool | list[str]
    """Text for text fields, true/false for checkboxes and radio buttons, option value(s) or label(s) for selects."""


class BrowserFillForm(BrowserTool):
    name = "browser_fill_form"
    description = (
        "Fill several form fields at once by their refs: text inputs and text areas get text, checkboxes and radio "
        "buttons true or false, selects an option's value or label. Does not submit; click the submit button next."
    )
    facts = MUTATING

    class Args(TabArgs):
        fields: list[FormField] = Field(min_length=1, max_length=100)
        """The fields to fill, in order."""

    async def act(self, runtime, session, args, ctx):
        tab = _page_tab(session, args)
        filled = []
        for field in args.fields:
            locator = await session.locate(tab, field.ref_id)
            kind = await locator.evaluate("e => (e.tagName + ':' + (e.type || '')).toLowerCase()")
            value = field.value
            if kind in ("input:checkbox", "input:radio"):
                if not isinstance(value, bool):
                    raise BrowserError(
                        "invalid_value", f"{field.ref_id} is a {kind[6:]}: give true or false.", ref_id=field.ref_id
                    )
                await session.act(tab, lambda loc=locator, v=value: loc.set_checked(v), settle=False)
            elif kind.startswith("select:"):
                values = [value] if isinstance(value, str) else value
                if isinstance(value, bool):
                    raise BrowserError("invalid_value", f"{field.ref_id} is a select: give option values or labels.")
                await session.act(tab, lambda loc=locator, v=values: _select(loc, v), settle=False)
            else:
                if not isinstance(value, str):
                    raise BrowserError("invalid_value", f"{field.ref_id} is a text field: give text.")
                await session.act(tab, lambda loc=locator, v=value: loc.fill(v), settle=False)
            if tab.dialog is not None:
                break
            filled.append(field.ref_id)
        return {**await session.state(tab), "filled": filled}


async def _select(target, values: list[str]) -> list[str]:
    """Match options by value first, then by label, so the model can use either."""
    options = await target.evaluate("e => Array.from(e.options).map(o => [o.value, o.label || o.text])")
    by_label = {label: value for value, label in reversed(options)}
    known = {value for value, _ in options}
    chosen = []
    for wanted in values:
        if wanted in known:
            chosen.append(wanted)
        elif wanted in by_label:
            chosen.append(by_label[wanted])
        else:
            available = [label for _, label in options][:50]
            raise BrowserError("no_such_option", f"No option {wanted!r}; the options are {available}.")
    return await target.select_option(value=chosen)


class BrowserSelect(BrowserTool):
    name = "browser_select"
    description = "Choose option(s) of a select element by value or visible label. Returns the selected values."
    facts = MUTATING

    class Args(TargetArgs):
        values: list[str] = Field(min_length=1, max_length=100)
        """Option values or labels; several only for a multiple select."""

    async def act(self, runtime, session, args, ctx):
        tab = _page_tab(session, args)
        if args.ref_id is not None:
            target = await session.locate(tab, args.ref_id)
        else:
            target = await session.element_at(tab, args.x, args.y)
        tag = await target.evaluate("e => e.tagName.toLowerCase()")
        if tag != "select":
            raise BrowserError("not_a_select", f"The element is a <{tag}>, not a <select>.")
        selected = await session.act(tab, lambda: _select(target, args.values))
        return {**await session.state(tab), "selected": selected or []}


class BrowserPressKey(BrowserTool):
    name = "browser_press_key"
    description = (
        "Press a key or chord, e.g. Enter, Escape, ArrowDown, Tab, Control+a, Shift+Tab. With a ref or point the "
        "element gets focus first; otherwise the key goes to whatever has focus."
    )
    facts = MUTATING

    class Args(TargetArgs):
        key: str = Field(min_length=1, max_length=64, pattern=r"^[^\s]+$")
        """Playwright key name or chord (Enter, ArrowLeft, Control+Shift+K, a, 1)."""

        target_required: ClassVar[bool] = False

    async def act(self, runtime, session, args, ctx):
        tab = _page_tab(session, args)
        if not args.has_target:
            await session.act(tab, lambda: tab.page.keyboard.press(args.key))
        else:

            async def on_point(x, y):
                await tab.page.mouse.click(x, y)
                await tab.page.keyboard.press(args.key)

            await _on_target(session, tab, args, on_ref=lambda loc: loc.press(args.key), on_point=on_point)
        return await session.state(tab)


class BrowserHover(BrowserTool):
    name = "browser_hover"
    description = "Move the mouse over an element (by ref) or a point, e.g. to open a menu or show a tooltip."
    facts = MUTATING

    class Args(TargetArgs):
        pass

    async def act(self, runtime, session, args, ctx):
        tab = _page_tab(session, args)
        await _on_target(
            session, tab, args, on_ref=lambda loc: loc.hover(), on_point=lambda x, y: tab.page.mouse.move(x, y)
        )
        return await session.state(tab)


class BrowserScroll(BrowserTool):
    name = "browser_scroll"
    description = (
        "Scroll: an element (by ref) into view, and/or the page (or the element under a point) by dx, dy pixels "
        "with the mouse wheel. Returns the page's scroll position."
    )
    facts = MUTATING

    class Args(TargetArgs):
        dx: float = Field(default=0, ge=-100_000, le=100_000)
        """Pixels to scroll right (negative: left)."""
        dy: float = Field(default=0, ge=-100_000, le=100_000)
        """Pixels to scroll down (negative: up)."""

        target_required: ClassVar[bool] = False

    async def act(self, runtime, session, args, ctx):
        tab = _page_tab(session, args)
        page = tab.page

        async def wheel(x, y):
            if args.dx or args.dy:
                await page.mouse.move(x, y)
                await page.mouse.wheel(args.dx, args.dy)

        if args.ref_id is not None:
            locator = await session.locate(tab, args.ref_id)
            await session.act(tab, locator.scroll_into_view_if_needed, settle=False)
            x, y = await session.center(tab, args.ref_id)
            await session.act(tab, lambda: wheel(x, y))
        else:
            size = page.viewport_size or {"width": 1280, "height": 800}
            x, y = (args.x, args.y) if args.x is not None else (size["width"] / 2, size["height"] / 2)
            session.point_check(tab, x, y)
            await session.act(tab, lambda: wheel(x, y))
        # The wheel event scrolls asynchronously: one frame later the position is settled.
        await page.evaluate("() => new Promise(done => requestAnimationFrame(() => done()))")
        position = await page.evaluate("() => [window.scrollX, window.scrollY]")
        return {**await session.state(tab), "scroll_x": position[0], "scroll_y": position[1]}


class BrowserDrag(BrowserTool):
    name = "browser_drag"
    description = "Drag from one element or point to another and drop there (mouse down, move, release)."
    facts = MUTATING

    class Args(TabArgs):
        from_ref_id: str | None = Field(default=None, pattern=REF_PATTERN)
        """The element to drag, by ref."""
        from_x: float | None = Field(default=None, ge=0)
        from_y: float | None = Field(default=None, ge=0)
        to_ref_id: str | None = Field(default=None, pattern=REF_PATTERN)
        """Where to drop, by ref."""
        to_x: float | None = Field(default=None, ge=0)
        to_y: float | None = Field(default=None, ge=0)

        @model_validator(mode="after")
        def _ends(self):
            for end in ("from", "to"):
                ref = getattr(self, f"{end}_ref_id")
                point = (getattr(self, f"{end}_x") is not None) + (getattr(self, f"{end}_y") is not None)
                if (ref is None and point != 2) or (ref is not None and point):
                    raise ValueError(f"give {end}_ref_id, or both {end}_x and {end}_y")
            return self

    async def act(self, runtime, session, args, ctx):
        tab = _page_tab(session, args)
        if args.from_ref_id is not None and args.to_ref_id is not None:
            source = await session.locate(tab, args.from_ref_id)
            target = await session.locate(tab, args.to_ref_id)
            await session.act(tab, lambda: source.drag_to(target))
            return await session.state(tab)
        start = await _point_of(session, tab, args.from_ref_id, args.from_x, args.from_y)
        end = await _point_of(session, tab, args.to_ref_id, args.to_x, args.to_y)
        mouse = tab.page.mouse

        async def drag():
            await mouse.move(*start)
            await mouse.down()
            await mouse.move(*end, steps=10)
            await mouse.up()

        await session.act(tab, drag)
        return await session.state(tab)


class BrowserUpload(BrowserTool):
    name = "browser_upload"
    description = (
        "Upload files from your workspace into a file input (by ref, or the control that opens a file chooser). "
        "Paths are relative to your workspace; nothing outside it can be uploaded."
    )
    facts = MUTATING

    class Args(TargetArgs):
        paths: list[str] = Field(min_length=1, max_length=10)
        """Workspace-relative paths of the files to upload."""

    async def act(self, runtime, session, args, ctx):
        tab = _page_tab(session, args)
        workspace = runtime.workspace(session.who)
        files = []
        for path in args.paths:
            name, data = await asyncio.to_thread(upload_read, workspace, path)
            kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
            files.append({"name": name, "mimeType": kind, "buffer": data})
        page = tab.page
        if args.ref_id is not None:
            element = await session.locate(tab, args.ref_id)
        else:
            element = await session.element_at(tab, args.x, args.y)
        is_file_input = await element.evaluate("e => e.tagName === 'INPUT' && e.type === 'file'")

        async def choose():
            if is_file_input:
                await element.set_input_files(files)
                return
            async with page.expect_file_chooser(timeout=5000) as chooser:
                await element.click()
            await (await chooser.value).set_files(files)

        await session.act(tab, choose)
        uploaded = [
            {"path": path, "name": f["name"], "bytes": len(f["buffer"])}
            for path, f in zip(args.paths, files, strict=True)
        ]
        return {**await session.state(tab), "uploaded": uploaded}


# -- waiting and reading ------------------------------------------------------------------------


class BrowserWaitFor(BrowserTool):
    name = "browser_wait_for"
    description = "Wait until some text appears, or disappears, on the page, or for a number of seconds."
    facts = READ_ONLY

    class Args(TabArgs):
        text: str | None = Field(default=None, min_length=1, max_length=1000)
        """Wait until this text is visible."""
        text_gone: str | None = Field(default=None, min_length=1, max_length=1000)
        """Wait until this text is no longer visible."""
        time_s: float | None = Field(default=None, gt=0, le=30)
        """Just wait this many seconds."""
        timeout_s: float = Field(default=10, gt=0, le=60)
        """Give up waiting for text after this many seconds."""

        @model_validator(mode="after")
        def _something(self):
            if self.text is None and self.text_gone is None and self.time_s is None:
                raise ValueError("give text, text_gone or time_s")
            return self

    async def act(self, runtime, session, args, ctx):
        tab = _page_tab(session, args)
        page = tab.page
        if args.time_s is not None:
            await page.wait_for_timeout(args.time_s * 1000)
        timeout = args.timeout_s * 1000
        try:
            if args.text is not None:
                await page.get_by_text(args.text).first.wait_for(state="visible", timeout=timeout)
            if args.text_gone is not None:
                await page.get_by_text(args.text_gone).first.wait_for(state="hidden", timeout=timeout)
        except Exception as exc:
            if "Timeout" not in type(exc).__name__:
                raise
            wanted = f"{args.text!r} to appear" if args.text is not None else f"{args.text_gone!r} to disappear"
            raise BrowserError("timeout", f"Waited {args.timeout_s:g} s for {wanted}; it did not.") from None
        return await session.state(tab)


class BrowserScreenshot(BrowserTool):
    name = "browser_screenshot"
    description = (
        "Take a screenshot of the viewport, the full page, or one element (by ref). It is saved in your workspace "
        "under browser/ and returned as a reference (path, size, sha256) an operator can open."
    )
    facts = READ_ONLY

    class Args(TabArgs):
        full_page: bool = False
        """Capture the whole scrollable page, not just the viewport."""
        ref_id: str | None = Field(default=None, pattern=REF_PATTERN)
        """Capture only this element."""
        format: Literal["png", "jpeg"] = "png"
        """Image format."""
        filename: str | None = Field(default=None, max_length=100)
        """File name under browser/ in the workspace (ending .png or .jpeg); a fresh name when omitted."""

    async def act(self, runtime, session, args, ctx):
        tab = _page_tab(session, args)
        if args.ref_id is not None:
            data = await (await session.locate(tab, args.ref_id)).screenshot(type=args.format)
        else:
            data = await tab.page.screenshot(full_page=args.full_page, type=args.format)
        workspace = runtime.workspace(session.who)
        artifact = await asyncio.to_thread(
            artifact_write,
            workspace,
            name=args.filename,
            suffix=f".{args.format}",
            data=data,
            media_type=f"image/{args.format}",
        )
        reference = artifact.as_dict(agent_name=session.who.agent_name, call_id=ctx.call_id)
        return {**await session.state(tab), "screenshot": reference}


class BrowserPdf(BrowserTool):
    name = "browser_pdf"
    description = (
        "Print the page to PDF (as the browser's print would, no download involved). Saved in your workspace under "
        "browser/ and returned as a reference."
    )
    facts = READ_ONLY

    class Args(TabArgs):
        paper: Literal["A4", "Letter", "Legal", "A3"] = "A4"
        """Paper size."""
        landscape: bool = False
        """Landscape orientation."""
        print_background: bool = True
        """Include background colours and images."""
        filename: str | None = Field(default=None, max_length=100)
        """File name under browser/ in the workspace (ending .pdf); a fresh name when omitted."""

    async def act(self, runtime, session, args, ctx):
        tab = _page_tab(session, args)
        data = await tab.page.pdf(format=args.paper, landscape=args.landscape, print_background=args.print_background)
        workspace = runtime.workspace(session.who)
        artifact = await asyncio.to_thread(
            artifact_write, workspace, name=args.filename, suffix=".pdf", data=data, media_type="application/pdf"
        )
        reference = artifact.as_dict(agent_name=session.who.agent_name, call_id=ctx.call_id)
        return {**await session.state(tab), "pdf": reference}


class BrowserEvaluate(BrowserTool):
    name = "browser_evaluate"
    description = (
        "Run JavaScript in the page and return its (JSON-serialisable) result: an expression, or a function; with "
        "ref_id the function receives that element. Arbitrary script can do anything the page can, so every call "
        "needs an operator's approval."
    )
    facts = DESTRUCTIVE

    class Args(TabArgs):
        expression: str = Field(min_length=1, max_length=100_000)
        """JavaScript, e.g. `document.title` or `() => [...document.links].length` or `(el) => el.value`."""
        ref_id: str | None = Field(default=None, pattern=REF_PATTERN)
        """Pass this element (from browser_snapshot) to the function."""

    async def act(self, runtime, session, args, ctx):
        tab = _page_tab(session, args)
        if args.ref_id is not None:
            locator = await session.locate(tab, args.ref_id)
            result = await session.act(tab, lambda: locator.evaluate(args.expression))
        else:
            result = await session.act(tab, lambda: tab.page.evaluate(args.expression))
        value, truncated = _json_safe(result)
        return {**await session.state(tab), "result": value, "truncated": truncated}


class BrowserConsole(BrowserTool):
    name = "browser_console"
    description = (
        "What the session's pages wrote to the console (log, info, warning, error), uncaught page errors and "
        "dialogs, oldest first. Pass since= the last seq you saw to get only newer entries."
    )
    facts = READ_ONLY

    class Args(TabArgs):
        since: int = Field(default=0, ge=0)
        """Only entries with a larger seq."""
        types: list[str] = Field(default_factory=list, max_length=10)
        """Only these types (log, info, warning, error, debug, pageerror, dialog)."""

    async def act(self, runtime, session, args, ctx):
        entries = [
            entry
            for entry in session.console
            if entry["seq"] > args.since
            and (args.tab_id is None or entry["tab_id"] == args.tab_id)
            and (not args.types or entry["type"] in args.types)
        ]
        return {"entries": entries, "last_seq": session.console_seq}


class BrowserNetwork(BrowserTool):
    name = "browser_network"
    description = (
        "The requests the session's pages made, with status, size and outcome: ok, redirected, failed, or blocked "
        "(refused by the network policy before any connection, with the rule that refused it)."
    )
    facts = READ_ONLY

    class Args(TabArgs):
        since: int = Field(default=0, ge=0)
        """Only requests with a larger seq."""
        blocked_only: bool = False
        """Only the blocked requests."""

    async def act(self, runtime, session, args, ctx):
        log = session.interceptor.log
        entries = [
            entry.as_dict()
            for entry in log.entries
            if entry.seq > args.since
            and (args.tab_id is None or entry.tab_id == args.tab_id)
            and (not args.blocked_only or entry.outcome == "blocked")
        ]
        return {"requests": entries, "blocked_total": log.blocked_total, "last_seq": log.seq}


# -- session state ----------------------------------------------------------------------------


class BrowserCookies(BrowserTool):
    name = "browser_cookies"
    description = (
        "Your session's cookies: list them (optionally for some URLs), set one, or clear them (all, or by name "
        "and/or domain). Other sessions and agents have cookies of their own."
    )
    facts = MUTATING
    read_only_actions = frozenset({"list"})

    class Args(ToolArgs):
        action: Literal["list", "set", "clear"] = "list"
        """What to do."""
        urls: list[str] = Field(default_factory=list, max_length=20)
        """list: only cookies sent to these URLs."""
        name: str | None = Field(default=None, min_length=1, max_length=256)
        """set: the cookie's name (required); clear: only cookies of this name."""
        value: str | None = Field(default=None, max_length=4096)
        """set: the cookie's value."""
        url: str | None = Field(default=None, max_length=2048)
        """set: the URL the cookie belongs to (or give domain and path)."""
        domain: str | None = Field(default=None, max_length=255)
        """set: the cookie's domain; clear: only cookies of this domain."""
        path: str = Field(default="/", max_length=1024)
        """set: the cookie's path."""
        expires: float | None = None
        """set: expiry as a Unix time; a session cookie when omitted."""
        http_only: bool = False
        secure: bool = False
        same_site: Literal["Strict", "Lax", "None"] = "Lax"

    async def act(self, runtime, session, args, ctx):
        context = session.context
        if args.action == "list":
            cookies = await context.cookies(args.urls or None)
            return {"cookies": cookies, "count": len(cookies)}
        if args.action == "set":
            if args.name is None or args.value is None or (args.url is None and args.domain is None):
                raise BrowserError("invalid_arguments", "set needs name, value, and url or domain.")
            cookie: dict[str, Any] = {"name": args.name, "value": args.value}
            if args.url is not None:
                cookie["url"] = _url_check(args.url)
            else:
                cookie.update(domain=args.domain, path=args.path)
            cookie.update(httpOnly=args.http_only, secure=args.secure, sameSite=args.same_site)
            if args.expires is not None:
                cookie["expires"] = args.expires
            await context.add_cookies([cookie])
            return {"set": {"name": args.name, "url": args.url, "domain": args.domain}}
        before = len(await context.cookies())
        await context.clear_cookies(name=args.name, domain=args.domain)
        return {"cleared": before - len(await context.cookies())}


class BrowserDialog(BrowserTool):
    name = "browser_dialog"
    description = (
        "Answer the alert, confirm, prompt or beforeunload dialog open on a tab: accept (with text for a prompt) "
        "or dismiss. The page is paused until its dialog is answered."
    )
    facts = MUTATING

    class Args(TabArgs):
        action: Literal["accept", "dismiss"]
        """Accept (OK) or dismiss (Cancel)."""
        prompt_text: str | None = Field(default=None, max_length=10_000)
        """For a prompt dialog: the text to answer with."""

    async def act(self, runtime, session, args, ctx):
        tab = session.tab(args.tab_id)
        dialog = tab.dialog
        if dialog is None:
            raise BrowserError("no_dialog", f"No dialog is open on tab {tab.id}.", tab_id=tab.id)
        answered = {**tab.dialog_info(), "action": args.action}
        tab.dialog = None
        if args.action == "accept":
            await (dialog.accept(args.prompt_text) if args.prompt_text is not None else dialog.accept())
        else:
            await dialog.dismiss()
        pending, tab.blocked_action = tab.blocked_action, None
        if pending is not None:
            # The action that opened the dialog resumes now; a second dialog pauses the page again.
            opened = asyncio.ensure_future(tab.dialog_opened.wait())
            tab.dialog_opened.clear()
            try:
                await asyncio.wait({pending, opened}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
            finally:
                opened.cancel()
        return {**await session.state(tab), "answered": answered}


class Geolocation(ToolArgs):
    latitude: float = Field(ge=-90, le=90)
    longitude: float = Field(ge=-180, le=180)
    accuracy: float = Field(default=10, ge=0)


class BrowserEmulate(BrowserTool):
    name = "browser_emulate"
    description = (
        "Change how your session's pages see the browser: colour scheme, reduced motion, print media, offline, "
        "time zone, locale, user agent, geolocation. Applies to every tab of the session and to new ones."
    )
    facts = MUTATING

    class Args(ToolArgs):
        color_scheme: Literal["light", "dark", "no-preference"] | None = None
        reduced_motion: Literal["reduce", "no-preference"] | None = None
        media: Literal["screen", "print"] | None = None
        offline: bool | None = None
        """Cut the pages off the network (requests fail) or bring them back."""
        timezone_id: str | None = Field(default=None, pattern=r"^[A-Za-z_]+(/[A-Za-z0-9_+-]+){0,2}$")
        """An IANA time zone, e.g. Europe/Paris."""
        locale: str | None = Field(default=None, pattern=r"^[A-Za-z]{2,3}(-[A-Za-z0-9]{2,8})*$")
        """A locale such as de-DE."""
        user_agent: str | None = Field(default=None, min_length=1, max_length=512)
        geolocation: Geolocation | None = None

    async def act(self, runtime, session, args, ctx):
        changed = args.model_dump(exclude_none=True)
        if not changed:
            raise BrowserError("invalid_arguments", "Name at least one thing to emulate.")
        for key in ("color_scheme", "reduced_motion", "media"):
            if key in changed:
                session.media[key] = changed[key]
        for key in ("timezone_id", "locale", "user_agent"):
            if key in changed:
                session.overrides[key] = changed[key]
        if args.offline is not None:
            await session.context.set_offline(args.offline)
        if args.geolocation is not None:
            await session.context.grant_permissions(["geolocation"])
            await session.context.set_geolocation(args.geolocation.model_dump())
        for tab in list(session.tabs.values()):
            try:
                await session.emulation_apply(tab)
            except Exception as exc:
                raise BrowserError("emulation_failed", f"Could not apply to tab {tab.id}: {exc}") from None
        return {"emulating": {**session.media, **session.overrides, **changed}}


class BrowserResize(BrowserTool):
    name = "browser_resize"
    description = "Resize a tab's viewport (the visible area pages lay out in), in CSS pixels."
    facts = MUTATING

    class Args(TabArgs):
        width: int = Field(ge=200, le=3840)
        height: int = Field(ge=200, le=2160)

    async def act(self, runtime, session, args, ctx):
        tab = session.tab(args.tab_id)
        await tab.page.set_viewport_size({"width": args.width, "height": args.height})
        return {**await session.state(tab), "viewport": tab.page.viewport_size}


class BrowserTabs(BrowserTool):
    name = "browser_tabs"
    description = (
        "Your session's tabs: list them, open a new one (optionally at a URL), make one current, or close one. "
        "Popups the page opens appear here as tabs too."
    )
    facts = MUTATING
    read_only_actions = frozenset({"list"})

    class Args(ToolArgs):
        action: Literal["list", "new", "select", "close"] = "list"
        tab_id: str | None = Field(default=None, pattern=TAB_PATTERN)
        """select/close: which tab."""
        url: str | None = Field(default=None, min_length=1, max_length=8192)
        """new: open this URL in the new tab."""

    async def act(self, runtime, session, args, ctx):
        if args.action == "new":
            url = _url_check(args.url) if args.url is not None else None
            tab = await session.tab_new()
            if url is not None:
                await session.goto(tab, url)
        elif args.action == "select":
            tab = session.tab(args.tab_id)
            session.current = tab.id
            await tab.page.bring_to_front()
        elif args.action == "close":
            tab = session.tab(args.tab_id)
            await tab.page.close()
        return {"tabs": await session.tabs_describe(), "current": session.current}


class BrowserSessionTool(BrowserTool):
    name = "browser_session"
    description = (
        "Your browser session: info (its tabs, profile, cookie count), list (your open sessions), or close (its "
        "tabs and cookies are discarded; a profile in use is saved first)."
    )
    facts = MUTATING
    read_only_actions = frozenset({"info", "list"})

    class Args(ToolArgs):
        action: Literal["info", "list", "close"] = "info"

    async def act(self, runtime, session, args, ctx):
        if args.action == "list":
            return {
                "sessions": [
                    {"session": s.who.session_key or None, "tabs": len(s.tabs), "profile": s.profile}
                    for s in runtime.sessions_of(session.who.agent_id)
                ]
            }
        info = {
            "session": session.who.session_key or None,
            "profile": session.profile,
            "tabs": await session.tabs_describe(),
            "cookies": len(await session.context.cookies()),
        }
        if args.action == "close":
            await runtime.session_close(session)
            info["closed"] = True
        return info


class BrowserProfile(BrowserTool):
    name = "browser_profile"
    description = (
        "Named persistent profiles keep you signed in: `use` reopens this session on a profile (its saved cookies "
        "and local storage; current tabs close), `save` writes the session's state now (it is also saved after "
        "every change and when the browser stops), `detach` goes back to a fresh unsaved session, `list` shows "
        "your profiles, `delete` removes one for good (needs approval)."
    )
    facts = MUTATING
    read_only_actions = frozenset({"list"})

    class Args(ToolArgs):
        action: Literal["list", "use", "save", "detach", "delete"] = "list"
        name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
        """use/delete: the profile's name."""

        @model_validator(mode="after")
        def _named(self):
            if self.action in ("use", "delete") and self.name is None:
                raise ValueError(f"{self.action} needs a profile name")
            return self

    def asks_for_arguments(self, args: Args) -> bool:
        return args.action == "delete"

    async def act(self, runtime, session, args, ctx):
        agent_id = session.who.agent_id
        if args.action == "list":
            profiles = await asyncio.to_thread(runtime.profiles.list, agent_id)
            return {"profiles": profiles, "in_use": session.profile}
        if args.action == "use":
            exists = await asyncio.to_thread(runtime.profiles.load, agent_id, args.name) is not None
            session = await runtime.profile_use(session, args.name)
            if not exists:
                await runtime.profile_save(session)
            return {"profile": args.name, "created": not exists, "cookies": len(await session.context.cookies())}
        if args.action == "save":
            size = await runtime.profile_save(session)
            return {"profile": session.profile, "bytes": size}
        if args.action == "detach":
            previous = session.profile
            await runtime.profile_use(session, None)
            return {"detached": previous}
        deleted = await runtime.profile_delete(session.who, args.name)
        if not deleted:
            raise BrowserError("profile_not_found", f"You have no profile named {args.name!r}.")
        return {"deleted": args.name}


BROWSER_TOOLS = (
    BrowserOpen,
    BrowserNavigate,
    BrowserSnapshot,
    BrowserClick,
    BrowserType,
    BrowserFillForm,
    BrowserSelect,
    BrowserPressKey,
    BrowserHover,
    BrowserScroll,
    BrowserDrag,
    BrowserUpload,
    BrowserWaitFor,
    BrowserScreenshot,
    BrowserPdf,
    BrowserEvaluate,
    BrowserConsole,
    BrowserNetwork,
    BrowserCookies,
    BrowserDialog,
    BrowserEmulate,
    BrowserResize,
    BrowserTabs,
    BrowserSessionTool,
    BrowserProfile,
)
