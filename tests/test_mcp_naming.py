"""The bridge's naming truth, facts from annotations, quarantine, collisions, longest-prefix ids, the registry seam."""

import pytest
from mcp.types import Tool, ToolAnnotations

from tools_app.chokepoint.base import READ_ONLY, ToolFacts, ToolResult, UntypedToolAdapter
from tools_app.chokepoint.registry import RegistryFrozen, ToolRegistry
from tools_app.mcp.bridge import BRIDGE_TOOL_NAMES, catalog_build
from tools_app.mcp.config import ReferenceUnusable, ServerSpec, config_problems, reference_problem
from tools_app.mcp.manager import Connection, _lenient_tools
from tools_app.mcp.naming import facts_from_annotations, mcp_tool_name, prefixed_resolve, schema_problem


@pytest.mark.parametrize(
    ("server", "tool", "expected"),
    [
        ("github", "create_issue", "github__create_issue"),
        ("github", "github:create_issue", "github__create_issue"),  # redundant prefix stripped
        ("github", "gitlab:create_issue", "github__gitlab_create_issue"),  # someone else's prefix is kept, mapped
        ("github", "github:", "github__github_"),  # nothing would be left: not stripped
        ("gh:sub", "gh:sub:list", "gh_sub__list"),
        ("everything", "get-tiny-image", "everything__get-tiny-image"),
        ("odd", "a.b c/d+é", "odd__a_b_c_d__"),
        ("time", "convert time!", "time__convert_time_"),
        ("s", "x" * 100, "s__" + "x" * 61),  # 64 characters at most
        ("s" * 70, "t", "s" * 64),
    ],
)
def test_naming(server, tool, expected):
    name = mcp_tool_name(server=server, tool=tool)
    assert name == expected
    assert len(name) <= 64


def test_naming_output_always_fits_the_registry():
    from tools_app.chokepoint.registry import TOOL_NAME

    for server, tool in [("a", "b"), ("x.y", "🙂" * 40), ("srv", "::::"), ("n" * 64, "z" * 64)]:
        assert TOOL_NAME.match(mcp_tool_name(server=server, tool=tool))


@pytest.mark.parametrize(
    ("schema", "quarantined"),
    [
        ({"type": "object", "properties": {"x": {"type": "string"}}}, False),
        ({"type": "object"}, False),
        ({"type": "array", "items": {}}, True),
        ({"properties": {}}, True),  # no type at all
        ({}, True),
        ("object", True),
        ({"type": "object", "properties": {"x": {"type": "no-such-type"}}}, True),  # not valid JSON Schema
    ],
)
def test_schema_problem(schema, quarantined):
    assert (schema_problem(schema) is not None) is quarantined


@pytest.mark.parametrize(
    ("annotations", "facts"),
    [
        (None, None),  # no annotations at all: unknown, asks under every tier
        (ToolAnnotations(title="only a title"), None),
        (ToolAnnotations(open_world_hint=True), None),
        (ToolAnnotations(read_only_hint=True), READ_ONLY),
        (ToolAnnotations(read_only_hint=True, destructive_hint=True), READ_ONLY),  # destructive is moot when read-only
        (ToolAnnotations(read_only_hint=False), ToolFacts(idempotent=False, requires_approval=True)),  # MCP default
        (ToolAnnotations(destructive_hint=True), ToolFacts(idempotent=False, requires_approval=True)),
        (ToolAnnotations(destructive_hint=False), ToolFacts(idempotent=False, requires_approval=False)),
        (ToolAnnotations(idempotent_hint=True), ToolFacts(idempotent=True, requires_approval=True)),
        (
            ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True),
            ToolFacts(idempotent=True, requires_approval=False),
        ),
    ],
)
def test_facts_from_annotations(annotations, facts):
    assert facts_from_annotations(annotations) == facts


@pytest.mark.parametrize(
    ("ident", "servers", "expected"),
    [
        ("gh:sub:repo://x", ["gh", "gh:sub"], ("gh:sub", "repo://x")),  # never to gh
        ("gh:repo://x", ["gh", "gh:sub"], ("gh", "repo://x")),
        ("gh:sub:x", ["gh:sub", "gh"], ("gh:sub", "x")),  # order does not matter
        (
            "everything:demo://resource/static/document/a.md",
            ["everything"],
            ("everything", "demo://resource/static/document/a.md"),
        ),
        ("ghost:x", ["gh"], None),
        ("gh", ["gh"], None),
        ("ghx:y", ["gh"], None),
    ],
)
def test_longest_prefix_resolution(ident, servers, expected):
    assert prefixed_resolve(ident=ident, servers=servers) == expected


def _connection(tools, capabilities=None):
    return Connection(
        client=None,
        watch=None,
        capabilities=capabilities or {"tools": {}},
        protocol_version="",
        server_info={},
        tools=tools,
    )


def _tool(name, schema=None, annotations=None):
    return Tool(name=name, input_schema=schema or {"type": "object"}, annotations=annotations)


def _spec(name, id_=1):
    return ServerSpec(id=id_, name=name, transport="stdio", command="x")


def test_catalog_quarantines_and_reports_collisions_first_holder_keeps_the_name():
    first = _connection([_tool("a.b"), _tool("a_b"), _tool("b__ok"), _tool("bad", schema={"type": "string"})])
    second = _connection([_tool("ok"), _tool("note_write")])
    catalog = catalog_build(
        manager=None,
        connected=[(_spec("a"), first), (_spec("a__b", 2), second)],
        needs_login=[],
        reserved={"a__b__note_write"}.__contains__,
    )
    assert set(catalog.tools) == {"a__a_b", "a__b__ok"}
    assert catalog.origins["a__a_b"] == ("a", "a.b")
    assert catalog.origins["a__b__ok"] == ("a", "b__ok")
    assert [(q.server, q.tool) for q in catalog.quarantined] == [("a", "bad")]
    assert "type 'string'" in catalog.quarantined[0].reason
    assert {(c.name, c.server, c.tool, c.taken_by) for c in catalog.collisions} == {
        ("a__a_b", "a", "a_b", "a:a.b"),
        ("a__b__ok", "a__b", "ok", "a:b__ok"),
        ("a__b__note_write", "a__b", "note_write", "a built-in tool"),
    }


def test_catalog_collision_across_servers_and_with_builtins():
    one = _connection([_tool("x__y")])
    two = _connection([_tool("y")])
    catalog = catalog_build(
        manager=None,
        connected=[(_spec("s"), one), (_spec("s__x", 2), two)],
        needs_login=[],
        reserved=lambda name: False,
    )
    assert set(catalog.tools) == {"s__x__y"}
    assert [(c.server, c.tool, c.taken_by) for c in catalog.collisions] == [("s__x", "y", "s:x__y")]

    builtin = catalog_build(
        manager=None,
        connected=[(_spec("note"), _connection([_tool("write")]))],
        needs_login=[],
        reserved=lambda n: True,
    )
    assert builtin.tools == {}
    assert builtin.collisions[0].taken_by == "a built-in tool"


def test_catalog_facts_and_gated_bridge_tools():
    tools = [
        _tool("read", annotations=ToolAnnotations(read_only_hint=True)),
        _tool("wipe", annotations=ToolAnnotations(destructive_hint=True)),
        _tool("bare"),
    ]
    plain = catalog_build(
        manager=None, connected=[(_spec("p"), _connection(tools))], needs_login=[], reserved=lambda n: False
    )
    assert plain.tools["p__read"].facts == READ_ONLY
    assert plain.tools["p__wipe"].facts.requires_approval is True
    assert plain.tools["p__bare"].facts is None
    assert not BRIDGE_TOOL_NAMES & set(plain.tools)

    resources = catalog_build(
        manager=None,
        connected=[(_spec("r"), _connection([], {"tools": {}, "resources": {}}))],
        needs_login=[],
        reserved=lambda n: False,
    )
    assert set(resources.tools) == {"mcp_list_resources", "mcp_list_resource_templates", "mcp_read_resource"}
    prompts = catalog_build(
        manager=None,
        connected=[(_spec("q"), _connection([], {"prompts": {}}))],
        needs_login=[],
        reserved=lambda n: False,
    )
    assert set(prompts.tools) == {"mcp_list_prompts", "mcp_get_prompt"}


def test_lenient_listing_keeps_bad_schemas_for_quarantine():
    listed, sound = _lenient_tools(
        [
            {"name": "fine", "inputSchema": {"type": "object"}},
            {"name": "array", "inputSchema": {"type": "array"}},
            {"name": "missing"},
            {"no": "name"},
        ]
    )
    assert [t.name for t in listed] == ["fine", "array", "missing"]
    assert [t.name for t in sound] == ["fine"]
    assert listed[1].input_schema == {"type": "array"}
    assert listed[2].input_schema is None


def test_config_problems():
    ok = {"command": "", "args": [], "env": {}, "url": "", "headers": {}, "network_allow": []}
    assert config_problems(transport="stdio", **{**ok, "command": "npx"}) == {}
    assert config_problems(transport="http", **{**ok, "url": "https://mcp.example.com/mcp"}) == {}
    assert "command" in config_problems(transport="stdio", **ok)
    assert "url" in config_problems(transport="http", **{**ok, "url": "ftp://x"})
    assert "url" in config_problems(transport="http", **{**ok, "url": "https://u:p@x/mcp"})
    assert "env" in config_problems(transport="stdio", **{**ok, "command": "x", "env": {"A=B": "1"}})
    assert "headers" in config_problems(transport="http", **{**ok, "url": "http://x/", "headers": {"X": "a\nb"}})
    assert "network_allow" in config_problems(transport="http", **{**ok, "url": "http://x/", "network_allow": ["a b"]})
    assert "transport" in config_problems(transport="ws", **ok)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("Bearer ${GITHUB_TOKEN}", None),
        ("${A}-${B_2}", None),
        ("literal $${NOT_A_REFERENCE} and pa$$word", None),
        ("${}", "must name an environment variable"),
        ("${2FA}", "must name an environment variable"),
        ("${ALEPH_SECRET_KEY}", "Aleph's own settings"),
        ("postgres ${DATABASE_URL}", "Aleph's own settings"),
        ("${REDIS_URL}", "Aleph's own settings"),
        ("${DJANGO_SETTINGS_MODULE}", "Aleph's own settings"),
        ("${OPEN", "not closed"),
    ],
)
def test_environment_references_are_checked_when_saved(value, problem):
    found = reference_problem(value)
    assert (found is None) if problem is None else (problem in found), found
    ok = {"command": "x", "args": [], "env": {"TOKEN": value}, "url": "", "headers": {}, "network_allow": []}
    assert ("env" in config_problems(transport="stdio", **ok)) is (problem is not None)


def test_references_are_filled_in_at_connect_time_and_an_unset_one_refuses():
    spec = ServerSpec(
        id=1,
        name="gh",
        transport="stdio",
        command="x",
        env=(("TOKEN", "${GH_TOKEN}"), ("LITERAL", "$${GH_TOKEN}"), ("PLAIN", "a$$b")),
    )
    assert spec.environment({"GH_TOKEN": "s3cret"}) == {"TOKEN": "s3cret", "LITERAL": "${GH_TOKEN}", "PLAIN": "a$$b"}
    with pytest.raises(ReferenceUnusable, match=r"env TOKEN refers to \$\{GH_TOKEN\}, which is not set") as unset:
        spec.environment({})
    assert "s3cret" not in str(unset.value)
    headers = (("Authorization", "Bearer ${T}"),)
    web = ServerSpec(id=2, name="web", transport="http", url="https://x/mcp", headers=headers)
    assert web.request_headers({"T": "abc"}) == {"Authorization": "Bearer abc"}
    with pytest.raises(ReferenceUnusable, match="line break"):
        web.request_headers({"T": "abc\r\nX-Injected: 1"})


# -- the registry's provider seam ------------------------------------------------------------------


def _adapter(name):
    async def run(args, ctx):
        return ToolResult.ok(name)

    return UntypedToolAdapter(name=name, description="", schema={"type": "object"}, function=run, facts=READ_ONLY)


class Provider:
    def __init__(self, *tools):
        self.tools = {t.name: t for t in tools}

    def get(self, name):
        return self.tools.get(name)

    def all(self):
        return list(self.tools.values())


def test_registry_consults_providers_after_static_tools_and_static_names_win():
    registry = ToolRegistry()
    static = _adapter("note_write")
    registry.register(static)
    provider = Provider(_adapter("note_write"), _adapter("srv__tool"))
    registry.attach(provider)
    registry.freeze()
    assert registry.get("note_write") is static
    assert registry.get("srv__tool") is provider.tools["srv__tool"]
    assert [t.name for t in registry.all()] == ["note_write", "srv__tool"]
    assert registry.all()[0] is static
    assert "srv__tool" in registry
    assert len(registry) == 2
    assert registry.is_static("note_write") and not registry.is_static("srv__tool")
    provider.tools.pop("srv__tool")  # tools come and go at run time
    assert registry.get("srv__tool") is None
    assert len(registry) == 1


def test_registry_refuses_a_provider_after_start_up_and_bad_provider_names():
    registry = ToolRegistry()
    registry.attach(Provider(_adapter("bad name")))
    assert registry.get("bad name") is None
    assert registry.all() == []
    registry.freeze()
    with pytest.raises(RegistryFrozen):
        registry.attach(Provider())


def test_registry_without_providers_behaves_as_before():
    registry = ToolRegistry()
    registry.register(_adapter("b"))
    registry.register(_adapter("a"))
    assert [t.name for t in registry.all()] == ["a", "b"]
    assert len(registry) == 2
    assert "a" in registry and "c" not in registry
