"""The model gateway against the official `openai` and `anthropic` packages.

The upstream is the stand-in model server of standin.py, written for these tests: this machine
reaches no model provider. The gateway runs in a real Cella server (conftest.py); its clients
are the providers' own SDKs, from the host with an API key that has `models:use`, and from
inside a sandbox created with `"model_access": true`, with the variables the server gave it.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
from typing import Any, Dict, List

import anthropic
import httpx
import openai
import pytest

from conftest import new_key
from standin import ANTHROPIC_KEY, CHAT_USAGE, MSG_USAGE, OPENAI_KEY, RESP_USAGE, TEXT, TOOL_ARGS

TOOLS_CHAT = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
TOOLS_RESP = [{"type": "function", "name": "get_weather", "description": "weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
TOOLS_MSG = [{"name": "get_weather", "description": "weather",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
MSGS = [{"role": "user", "content": "Say hello"}]


def oai(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/gateway/openai/v1", api_key=key, max_retries=0, timeout=30)


def ant(server, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url + "/gateway/anthropic", api_key=key, max_retries=0, timeout=30)


def last(standin, path: str) -> Dict[str, Any]:
    reqs = [r for r in standin.requests if r["path"].split("?")[0] == path]
    assert reqs, f"the stand-in got no request on {path}"
    return reqs[-1]


def assert_clean_upstream_headers(req: Dict[str, Any], secret: str) -> None:
    """The caller's credential never reaches the upstream."""
    for k, v in req["headers"].items():
        assert secret not in v, f"the caller's credential went upstream in {k}"


# --- from the host, with an API key that has models:use -----------------------------------


def test_chat_completion(server, standin, models_key):
    c = oai(server, models_key)
    r = c.chat.completions.create(model="gpt-test", messages=MSGS)
    assert r.choices[0].message.content == TEXT
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (21, 9)
    req = last(standin, "/v1/chat/completions")
    assert req["headers"]["authorization"] == f"Bearer {OPENAI_KEY}"
    assert "x-api-key" not in req["headers"]
    assert req["body"]["model"] == "gpt-test"
    assert_clean_upstream_headers(req, models_key)


def test_chat_stream_asks_the_upstream_for_usage(server, standin, models_key):
    c = oai(server, models_key)
    chunks = list(c.chat.completions.create(model="gpt-test", messages=MSGS, stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == TEXT
    # The client did not ask; the gateway did, and the upstream's counts come through.
    req = last(standin, "/v1/chat/completions")
    assert req["body"]["stream_options"] == {"include_usage": True}
    assert chunks[-1].usage.prompt_tokens == CHAT_USAGE["prompt_tokens"]
    assert chunks[-1].usage.completion_tokens == CHAT_USAGE["completion_tokens"]
    # A client that asked keeps its own options.
    chunks = list(c.chat.completions.create(model="gpt-test", messages=MSGS, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].usage.total_tokens == 30


def test_chat_tool_calls(server, models_key):
    c = oai(server, models_key)
    r = c.chat.completions.create(model="gpt-test", messages=MSGS, tools=TOOLS_CHAT)
    call = r.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert r.choices[0].finish_reason == "tool_calls"
    args, name = "", None
    for ch in c.chat.completions.create(model="gpt-test", messages=MSGS, tools=TOOLS_CHAT, stream=True):
        for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
            name = name or (tc.function.name if tc.function else None)
            args += (tc.function.arguments or "") if tc.function else ""
    assert (name, json.loads(args)) == ("get_weather", {"city": "Paris"})


def test_responses(server, standin, models_key):
    c = oai(server, models_key)
    r = c.responses.create(model="gpt-test", input="Say hello")
    assert r.output_text == TEXT
    assert (r.usage.input_tokens, r.usage.output_tokens) == (13, 5)
    assert last(standin, "/v1/responses")["headers"]["authorization"] == f"Bearer {OPENAI_KEY}"
    deltas, final = [], None
    for ev in c.responses.create(model="gpt-test", input="Say hello", stream=True):
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        if ev.type == "response.completed":
            final = ev.response
    assert "".join(deltas) == TEXT
    assert final.usage.output_tokens == RESP_USAGE["output_tokens"]
    # Tool calls.
    r = c.responses.create(model="gpt-test", input="weather?", tools=TOOLS_RESP)
    fc = [o for o in r.output if o.type == "function_call"][0]
    assert (fc.name, json.loads(fc.arguments)) == ("get_weather", {"city": "Paris"})
    with c.responses.stream(model="gpt-test", input="weather?", tools=TOOLS_RESP) as s:
        done = s.get_final_response()
    assert [o.name for o in done.output if o.type == "function_call"] == ["get_weather"]


def test_anthropic_messages(server, standin, models_key):
    c = ant(server, models_key)
    m = c.messages.create(model="claude-test", max_tokens=64, messages=MSGS)
    assert m.content[0].text == TEXT
    assert (m.usage.input_tokens, m.usage.output_tokens) == (17, 8)
    req = last(standin, "/v1/messages")
    assert req["headers"]["x-api-key"] == ANTHROPIC_KEY
    assert "authorization" not in req["headers"]
    assert req["headers"]["anthropic-version"]
    assert_clean_upstream_headers(req, models_key)
    with c.messages.stream(model="claude-test", max_tokens=64, messages=MSGS) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == TEXT
    # The latest (cumulative) message_delta count, never a sum.
    assert final.usage.output_tokens == MSG_USAGE["output_tokens"]
    # Tool use, whole and streamed.
    m = c.messages.create(model="claude-test", max_tokens=64, messages=MSGS, tools=TOOLS_MSG)
    assert m.stop_reason == "tool_use" and m.content[0].input == {"city": "Paris"}
    with c.messages.stream(model="claude-test", max_tokens=64, messages=MSGS, tools=TOOLS_MSG) as s:
        final = s.get_final_message()
    assert final.content[0].name == "get_weather" and final.content[0].input == {"city": "Paris"}


def test_anthropic_with_a_bearer_key_too(server, models_key):
    """Claude Code's ANTHROPIC_AUTH_TOKEN sends `Authorization: Bearer`."""
    c = anthropic.Anthropic(base_url=server.url + "/gateway/anthropic", auth_token=models_key, max_retries=0)
    assert c.messages.create(model="claude-test", max_tokens=8, messages=MSGS).content[0].text == TEXT


def test_models_lists_the_openai_models(server, models_key):
    ids = sorted(m.id for m in oai(server, models_key).models.list())
    assert "gpt-test" in ids and "claude-test" not in ids


# --- refusals -----------------------------------------------------------------------------


def test_unknown_credentials_are_401(server):
    with pytest.raises(openai.AuthenticationError):
        oai(server, "cella_not_a_key").chat.completions.create(model="gpt-test", messages=MSGS)
    with pytest.raises(anthropic.AuthenticationError):
        ant(server, "cst_" + "x" * 43).messages.create(model="claude-test", max_tokens=8, messages=MSGS)
    r = httpx.post(server.url + "/gateway/openai/v1/chat/completions", json={"model": "gpt-test", "messages": MSGS})
    assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHORIZED"


def test_a_key_without_models_use_is_403(server, sandbox_key):
    with pytest.raises(openai.PermissionDeniedError):
        oai(server, sandbox_key).chat.completions.create(model="gpt-test", messages=MSGS)


def test_upstream_errors_pass_through_in_the_providers_shape(server, models_key):
    with pytest.raises(openai.BadRequestError) as e:
        oai(server, models_key).chat.completions.create(model="gpt-test-bad", messages=MSGS)
    assert e.value.code == "standin_refusal"
    with pytest.raises(anthropic.BadRequestError) as e2:
        ant(server, models_key).messages.create(model="claude-test-bad", max_tokens=8, messages=MSGS)
    assert "stand-in refuses" in str(e2.value)
    # Anthropic's required max_tokens missing: the upstream's own 400.
    with pytest.raises(anthropic.BadRequestError):
        ant(server, models_key).messages.create(model="claude-test", messages=MSGS, max_tokens=None)  # type: ignore


def test_unknown_model_is_404(server, models_key):
    with pytest.raises(openai.NotFoundError):
        oai(server, models_key).chat.completions.create(model="no-such-model", messages=MSGS)
    # A model of the other provider's API.
    with pytest.raises(anthropic.NotFoundError):
        ant(server, models_key).messages.create(model="gpt-test", max_tokens=8, messages=MSGS)


def test_upstream_down_is_502_in_our_envelope(server, models_key):
    with pytest.raises(openai.InternalServerError) as e:
        oai(server, models_key).chat.completions.create(model="gpt-down", messages=MSGS)
    assert e.value.status_code == 502
    r = httpx.post(server.url + "/gateway/openai/v1/chat/completions",
                   headers={"Authorization": f"Bearer {models_key}"}, json={"model": "gpt-down", "messages": MSGS})
    assert r.status_code == 502
    assert r.json() == {"error": {"code": "BAD_GATEWAY", "message": r.json()["error"]["message"],
                                  "details": {"upstream": "down"}}}
    assert "127.0.0.1" not in r.text  # the upstream's address is not told


def test_an_upstream_that_dies_mid_stream_raises_in_the_sdk(server, models_key):
    got: List[str] = []
    with pytest.raises(openai.APIError):
        for ch in oai(server, models_key).chat.completions.create(model="gpt-test-die", messages=MSGS, stream=True):
            if ch.choices:
                got.append(ch.choices[0].delta.content or "")
    assert "".join(got) == "Hel"  # what came before the break was forwarded
    with pytest.raises(openai.APIError):
        for _ in oai(server, models_key).responses.create(model="gpt-test-die", input="x", stream=True):
            pass
    with pytest.raises(anthropic.APIError):
        with ant(server, models_key).messages.stream(model="claude-test-die", max_tokens=8, messages=MSGS) as s:
            for _ in s.text_stream:
                pass


def test_model_allowlist(server, admin, models_key, workspace):
    def patch(settings):
        return admin.patch(f"/workspaces/{workspace}", json={"settings": settings})

    for bad in ([""], ["a", "a"], "gpt-test", [1]):
        r = patch({"model_allowlist": bad})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["details"]["field"].startswith("settings.model_allowlist"), r.text
    r = patch({"model_allowlist": ["gpt-test"]})
    assert r.status_code == 200, r.text
    assert r.json()["data"]["settings"]["model_allowlist"] == ["gpt-test"]
    try:
        with pytest.raises(anthropic.PermissionDeniedError):
            ant(server, models_key).messages.create(model="claude-test", max_tokens=8, messages=MSGS)
        with pytest.raises(openai.PermissionDeniedError):
            oai(server, models_key).chat.completions.create(model="gpt-other", messages=MSGS)
        assert [m.id for m in oai(server, models_key).models.list()] == ["gpt-test"]
        assert oai(server, models_key).chat.completions.create(model="gpt-test", messages=MSGS).choices
    finally:
        assert patch({"model_allowlist": []}).status_code == 200


# --- from inside a sandbox with model access ----------------------------------------------

INSIDE = r"""
import json, os, socket, sys
sys.path.insert(0, "/tmp/gw/site")
import openai, anthropic
out = {"env": {k: os.environ.get(k, "") for k in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL")},
       "has_key": os.environ.get("OPENAI_API_KEY", "").startswith("cst_")}
c = openai.OpenAI(max_retries=0)
out["chat"] = c.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}]).choices[0].message.content
out["chat_stream"] = "".join(ch.choices[0].delta.content or "" for ch in
    c.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}], stream=True) if ch.choices)
out["responses"] = c.responses.create(model="gpt-test", input="hi").output_text
a = anthropic.Anthropic(max_retries=0)
out["messages"] = a.messages.create(model="claude-test", max_tokens=16, messages=[{"role": "user", "content": "hi"}]).content[0].text
with a.messages.stream(model="claude-test", max_tokens=16, messages=[{"role": "user", "content": "hi"}]) as s:
    out["messages_stream"] = "".join(s.text_stream)
host = out["env"]["OPENAI_BASE_URL"].split("//")[1].split(":")[0]
def reach(port):
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((host, port)); return True
    except OSError:
        return False
    finally:
        s.close()
out["other_port"] = reach(int(sys.argv[1]))
out["ssh_port"] = reach(22)
print(json.dumps(out))
"""


@pytest.fixture(params=["namespace", "gvisor"])
def model_sandbox(request, server, sandbox_key, packages_tar):
    """A sandbox with model access on each runtime (gVisor's reaches the gateway through its
    own network stack)."""
    if request.param == "gvisor" and shutil.which("runsc") is None:
        pytest.skip("runsc is not installed")
    api = httpx.Client(base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {sandbox_key}"}, timeout=120)
    r = api.post("/sandboxes", json={"size": "xs", "model_access": True, "network": {"egress": "deny"},
                                     "runtime": request.param})
    assert r.status_code in (200, 201), r.text
    sb = r.json()["data"]
    assert sb["runtime"] == request.param
    assert "cst_" not in r.text
    try:
        up = api.put(f"/sandboxes/{sb['id']}/files", params={"path": "/tmp/gw/site.tar.gz"}, content=packages_tar)
        assert up.status_code == 200, up.text
        x = api.post(f"/sandboxes/{sb['id']}/exec", json={"command": "cd /tmp/gw && tar -xzf site.tar.gz"})
        assert x.json()["data"]["exit_code"] == 0, x.text
        yield api, sb
    finally:
        api.delete(f"/sandboxes/{sb['id']}")
        api.close()


def test_from_inside_a_sandbox(server, standin, model_sandbox):
    api, sb = model_sandbox
    # Something else listening on every address of the host: the sandbox must not reach it.
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    other.bind(("0.0.0.0", 0))
    other.listen(8)
    threading.Thread(target=lambda: [other.accept()[0].close() for _ in range(8)], daemon=True).start()
    try:
        script = api.put(f"/sandboxes/{sb['id']}/files", params={"path": "/tmp/gw/inside.py"}, content=INSIDE.encode())
        assert script.status_code == 200
        r = api.post(f"/sandboxes/{sb['id']}/exec",
                     json={"argv": ["python3", "/tmp/gw/inside.py", str(other.getsockname()[1])], "timeout_sec": 120})
        res = r.json()["data"]
        assert res["exit_code"] == 0, res["stderr"][-3000:]
        out = json.loads(res["stdout"])
    finally:
        other.close()
    port = server.url.rsplit(":", 1)[1]
    assert out["env"]["OPENAI_BASE_URL"].endswith(f":{port}/gateway/openai/v1")
    assert out["env"]["ANTHROPIC_BASE_URL"].endswith(f":{port}/gateway/anthropic")
    assert out["has_key"]
    assert out["chat"] == out["chat_stream"] == out["responses"] == TEXT
    assert out["messages"] == out["messages_stream"] == TEXT
    assert out["other_port"] is False and out["ssh_port"] is False, out
    # The token stays out of the API's answers.
    assert "cst_" not in api.get(f"/sandboxes/{sb['id']}").text


def test_a_sandbox_token_works_only_from_its_sandbox_and_dies_with_it(server, model_sandbox):
    api, sb = model_sandbox
    r = api.post(f"/sandboxes/{sb['id']}/exec", json={"command": "printenv OPENAI_API_KEY"})
    token = r.json()["data"]["stdout"].strip()
    assert token.startswith("cst_")
    # From the host (another address): 403.
    with pytest.raises(openai.PermissionDeniedError):
        oai(server, token).chat.completions.create(model="gpt-test", messages=MSGS)
    with pytest.raises(anthropic.PermissionDeniedError):
        ant(server, token).messages.create(model="claude-test", max_tokens=8, messages=MSGS)
    # Destroyed: 401 at once.
    assert api.delete(f"/sandboxes/{sb['id']}").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        oai(server, token).chat.completions.create(model="gpt-test", messages=MSGS)


# --- metering (the ledger) ----------------------------------------------------------------


def credit(admin: httpx.Client, workspace: str, amount: str) -> None:
    r = admin.post(f"/workspaces/{workspace}/wallet/credits", json={"amount": amount, "reference": "gateway tests"})
    if r.status_code in (404, 405):
        pytest.skip("this build has no wallet routes yet")
    assert r.status_code in (200, 201), r.text


def model_entries(admin: httpx.Client, workspace: str, n: int) -> List[Dict[str, Any]]:
    """The workspace's model entries once there are `n` (each is written as its answer ends)."""
    import time

    for _ in range(300):
        r = admin.get(f"/workspaces/{workspace}/ledger", params={"limit": "1000"})
        assert r.status_code == 200, r.text
        got = [e for e in r.json()["data"] if e["kind"] == "model"]
        if len(got) >= n:
            return got
        time.sleep(0.02)
    raise AssertionError(f"fewer than {n} model entries")


def test_metering_writes_exact_model_entries_and_refuses_a_spent_wallet(server, admin):
    r = admin.post("/workspaces", json={"name": "gateway-metering", "plan": "developer", "kind": "organization"})
    ws = r.json()["data"]["id"]
    key = new_key(admin, ws, ["models:use"])
    with pytest.raises(openai.APIStatusError) as e:
        oai(server, key).chat.completions.create(model="gpt-priced", messages=MSGS)
    assert e.value.status_code == 402
    credit(admin, ws, "0.000400")
    c = oai(server, key)
    assert c.chat.completions.create(model="gpt-priced", messages=MSGS).usage.prompt_tokens == 21
    list(c.chat.completions.create(model="gpt-priced", messages=MSGS, stream=True))
    with ant(server, key).messages.stream(model="claude-priced", max_tokens=8, messages=MSGS) as s:
        s.get_final_message()
    got = model_entries(admin, ws, 3)
    assert sorted(x["amount"] for x in got) == ["-0.000143", "-0.000143", "-0.000180"]
    # 400 - 466 < 0: the wallet is spent, the next request is refused.
    with pytest.raises(openai.APIStatusError) as e:
        c.chat.completions.create(model="gpt-priced", messages=MSGS)
    assert e.value.status_code == 402
    assert len(model_entries(admin, ws, 3)) == 3


# --- bad input: the gateway's own parsing never answers 5xx ------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

GATEWAY_POSTS = ["/gateway/openai/v1/chat/completions", "/gateway/openai/v1/responses",
                 "/gateway/anthropic/v1/messages"]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40),
    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=12), kids, max_size=5),
    max_leaves=30,
)
# A body whose model the gateway does not serve (absent, of the wrong type, or unknown), with
# anything else beside it: the gateway itself must refuse it with a 4xx, never pass it on.
BAD_MODEL = st.one_of(st.none(), st.integers(), st.lists(st.text(max_size=5), max_size=3),
                      st.text(max_size=60).filter(lambda m: m not in PRICES_SERVED))
PRICES_SERVED = {"gpt-test", "gpt-priced", "claude-priced", "gpt-test-bad", "gpt-test-die",
                 "gpt-other", "gpt-down", "claude-test", "claude-test-bad", "claude-test-die"}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(GATEWAY_POSTS), extra=st.dictionaries(st.text(max_size=12), JSON, max_size=6),
       model=BAD_MODEL, drop_model=st.booleans(), stream=JSON)
def test_fuzzed_bodies_never_get_a_5xx(server, models_key, path, extra, model, drop_model, stream):
    body = dict(extra)
    body.pop("model", None)
    if not drop_model:
        body["model"] = model
    if stream is not None:
        body["stream"] = stream
    r = httpx.post(server.url + path, headers={"Authorization": f"Bearer {models_key}"},
                   json=body, timeout=30)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300], body)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(GATEWAY_POSTS), raw=st.binary(max_size=300))
def test_bodies_that_are_not_json_objects_are_400(server, models_key, path, raw):
    r = httpx.post(server.url + path, headers={"Authorization": f"Bearer {models_key}",
                                              "Content-Type": "application/json"},
                   content=raw, timeout=30)
    try:
        is_object = isinstance(json.loads(raw), dict)
    except ValueError:
        is_object = False
    if not is_object:
        assert r.status_code == 400, (r.status_code, r.text[:300], raw)
    else:
        assert 400 <= r.status_code < 500, (r.status_code, r.text[:300], raw)


def test_deep_huge_and_oversized_bodies_are_refused_cleanly(server, models_key):
    h = {"Authorization": f"Bearer {models_key}", "Content-Type": "application/json"}
    url = server.url + "/gateway/openai/v1/chat/completions"
    deep = "[" * 100_000 + "]" * 100_000
    for raw in [deep, '{"model": ' + "9" * 100_000 + "}", '{"model": "gpt-test", "messages": ' + deep + "}"]:
        r = httpx.post(url, headers=h, content=raw.encode(), timeout=60)
        assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    # Past [gateway] max_body_bytes (32 MiB by default): 413, before anything goes upstream.
    big = b'{"model": "gpt-test", "messages": [], "pad": "' + b"x" * (33 << 20) + b'"}'
    r = httpx.post(url, headers=h, content=big, timeout=120)
    assert r.status_code == 413, (r.status_code, r.text[:300])
