"""Schemathesis against the OpenAPI document a real daphne serves: no 5xx, and every response matches its own schema."""

import time
from collections import Counter

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.conftest import make_cast
from tools_app.models import ToolCall

EXAMPLES_PER_OPERATION = 15
CHECKS = [not_a_server_error, response_schema_conformance]
FUZZ = settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    database=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
TOOLS = ("note_search", "note_write", "vault_store", "no_such_tool")
CHANNELS = ("ops", "lab", "nightly", "nowhere")
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=8,
)
TOOL_INPUTS = st.one_of(
    st.fixed_dictionaries({"query": st.text(min_size=1, max_size=30)}, optional={"limit": st.integers(-5, 200)}),
    st.fixed_dictionaries({"text": st.text(max_size=60)}),
    st.fixed_dictionaries({"name": st.text(max_size=20), "value": st.text(max_size=20)}),
    st.dictionaries(st.sampled_from(["query", "text", "name", "value", "limit", "other"]), JSON_VALUES, max_size=3),
)
# A short wait: with the approval desk wired, a call that asks parks and answers 202 once the wait is over.
CALL_OPTIONS = {"session": st.text(min_size=1, max_size=20)}
WAIT = st.floats(0, 0.2)
KNOWN_CALLS = st.one_of(
    st.fixed_dictionaries(
        {
            "tool": st.just("note_search"),
            "input": st.fixed_dictionaries({"query": st.text(min_size=1, max_size=30)}),
            "channel": st.sampled_from(CHANNELS[:3]),
            "wait": WAIT,
        },
        optional=CALL_OPTIONS,
    ),
    st.fixed_dictionaries(
        {
            "tool": st.just("note_write"),
            "input": st.fixed_dictionaries({"text": st.text(min_size=1, max_size=60)}),
            "channel": st.sampled_from(CHANNELS[:3]),
            "wait": WAIT,
        },
        optional=CALL_OPTIONS,
    ),
    st.fixed_dictionaries(
        {"tool": st.sampled_from(TOOLS), "input": TOOL_INPUTS, "channel": st.sampled_from(CHANNELS), "wait": WAIT},
        optional=CALL_OPTIONS,
    ),
)
KNOWN_EXPLAINS = st.fixed_dictionaries(
    {
        "agent": st.sampled_from(["builder", "scout", "nobody"]),
        "tool": st.sampled_from(TOOLS),
        "input": TOOL_INPUTS,
        "channel": st.sampled_from(CHANNELS),
    }
)


class Fuzzer:
    """Runs bounded examples per operation, tallies status codes and keeps every failure to report at the end."""

    def __init__(self, base_url: str, session: requests.Session):
        self.base_url = base_url
        self.session = session
        self.statuses: Counter[tuple[str, int]] = Counter()
        self.failures: dict[str, str] = {}

    def _send(self, case, headers: dict) -> None:
        response = case.call_and_validate(
            base_url=self.base_url, session=self.session, headers=headers, checks=CHECKS, timeout=15
        )
        self.statuses[(case.operation.label, response.status_code)] += 1

    def run(self, name: str, strategy, headers: dict, examples: int = EXAMPLES_PER_OPERATION) -> None:
        @settings(FUZZ, max_examples=examples)
        @given(case=strategy)
        def each(case):
            self._send(case, headers)

        try:
            each()
        except Exception as exc:  # collect every operation's failure, then report them together
            self.failures[name] = f"{type(exc).__name__}: {exc}"[:3000]

    def sent(self, label: str, status: int | None = None) -> int:
        return sum(n for (lab, code), n in self.statuses.items() if lab == label and status in (None, code))


def test_api_conforms_to_its_schema_under_fuzzing(daphne_server):
    cast = make_cast()
    as_agent = {"Authorization": f"Bearer {cast.builder.token}"}
    as_admin = {"Authorization": f"Bearer {cast.admin.token}"}
    schema = schemathesis.openapi.from_url(f"{daphne_server.url}/api/v1/schema/", timeout=15)
    operations = {result.ok().label: result.ok() for result in schema.get_all_operations()}
    expected = {
        "GET /api/v1/tools/",
        "GET /api/v1/tools/{name}/",
        "GET /api/v1/tools/schema/",
        "POST /api/v1/calls/",
        "GET /api/v1/calls/{call_id}/",
        "POST /api/v1/policy/explain/",
        "GET /api/v1/health/",
    }
    assert expected <= set(operations), sorted(operations)
    started = time.monotonic()
    with requests.Session() as session:
        fuzz = Fuzzer(daphne_server.url, session)
        for label, operation in operations.items():
            parameters = list(operation.iter_parameters())
            fuzz.run(f"{label} positive", operation.as_strategy(), as_agent)
            if parameters:
                fuzz.run(f"{label} negative", operation.as_strategy(schemathesis.GenerationMode.NEGATIVE), as_agent)
            if any(p.name == "channel" and p.location == "query" for p in parameters):
                fuzz.run(f"{label} in ops", operation.as_strategy(query={"channel": "ops"}), as_agent)
        calls = operations["POST /api/v1/calls/"]
        fuzz.run("calls of known tools", KNOWN_CALLS.map(lambda body: calls.Case(body=body)), as_agent, 50)
        explain = operations["POST /api/v1/policy/explain/"]
        fuzz.run("explain as admin", KNOWN_EXPLAINS.map(lambda body: explain.Case(body=body)), as_admin, 25)
        describe = operations["GET /api/v1/tools/{name}/"]
        names = st.sampled_from(TOOLS).map(
            lambda n: describe.Case(path_parameters={"name": n}, query={"channel": "ops"})
        )
        fuzz.run("known tool definitions", names, as_agent)
        call_ids = [str(i) for i in ToolCall.objects.values_list("id", flat=True)[:20]]
        detail = operations["GET /api/v1/calls/{call_id}/"]
        if call_ids:
            cases = st.sampled_from(call_ids).map(
                lambda i: detail.Case(path_parameters={"call_id": i}, query={"wait": 0})
            )
            fuzz.run("existing calls", cases, as_agent)
    elapsed = time.monotonic() - started
    assert not fuzz.failures, "\n\n".join(f"{label}:\n{text}" for label, text in fuzz.failures.items())
    # The fuzzing reached the real paths, not only the refusals.
    assert fuzz.sent("GET /api/v1/tools/", 200) > 0, fuzz.statuses
    assert fuzz.sent("GET /api/v1/tools/{name}/", 200) > 0, fuzz.statuses
    assert fuzz.sent("POST /api/v1/calls/", 200) > 0, fuzz.statuses
    assert fuzz.sent("POST /api/v1/calls/", 400) > 0, fuzz.statuses
    assert fuzz.sent("POST /api/v1/policy/explain/", 200) > 0, fuzz.statuses
    assert fuzz.sent("GET /api/v1/calls/{call_id}/", 200) > 0, fuzz.statuses
    for label in expected - {"GET /api/v1/health/"}:
        assert fuzz.sent(label) >= EXAMPLES_PER_OPERATION, (label, fuzz.statuses)
    assert elapsed < 60, f"{sum(fuzz.statuses.values())} requests took {elapsed:.1f}s"
