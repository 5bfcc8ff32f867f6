"""A real daphne serves the API and reads what the test wrote to the database."""

import httpx


def test_daphne_serves_health_and_an_agent_call(daphne_server):
    from tests.conftest import make_cast

    cast = make_cast()
    health = httpx.get(f"{daphne_server.url}/api/v1/health/", timeout=10)
    assert health.status_code == 200
    assert health.json()["database"]["ok"] is True
    response = httpx.post(
        f"{daphne_server.url}/api/v1/calls/",
        headers={"Authorization": f"Bearer {cast.builder.token}"},
        json={"tool": "note_search", "input": {"query": "anything"}, "channel": "ops"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "succeeded"
    assert response.json()["decision"]["rule"] == "tier:ask"
