"""A stand-in model server for the gateway's tests.

This machine reaches no model provider, so the tests run the gateway against this server,
written here, which answers in OpenAI's and Anthropic's exact wire formats: chat completions,
responses and messages, whole and streamed (chunked SSE, with the usage events each provider
sends), tool calls, and errors in each provider's error shape. It checks what it gets as the
real services would: the path, the upstream's key in the provider's auth header (and no other
credential), `anthropic-version`, a JSON body with a model. Every request is kept in
``StandIn.requests`` for the tests to look at.

Models with special behaviour: ``*-bad`` answers 400 in the provider's shape, ``*-die`` breaks
its stream off after two events (the connection closes without the end of the chunked body).

Token counts are fixed per API so that costs can be checked exactly: chat 21 in / 9 out,
responses 13 / 5, messages 17 in + 3 read from cache / 8 out.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional

OPENAI_KEY = "sk-standin-openai-key"
ANTHROPIC_KEY = "sk-ant-standin-key"

CHAT_USAGE = {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30,
              "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0}}
RESP_USAGE = {"input_tokens": 13, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
              "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 18}
MSG_USAGE = {"input_tokens": 17, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 3, "output_tokens": 8}

TEXT = "Hello from the stand-in."
TOOL_ARGS = '{"city": "Paris"}'


def _pieces(text: str) -> List[str]:
    return [text[i:i + 5] for i in range(0, len(text), 5)]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # --- plumbing -------------------------------------------------------------------------

    def _json(self, status: int, body: Dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _event(self, data: Any, event: Optional[str] = None) -> None:
        text = data if isinstance(data, str) else json.dumps(data)
        head = f"event: {event}\n" if event else ""
        self._chunk(f"{head}data: {text}\n\n".encode())

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _die(self) -> None:
        """Ends the connection in the middle of the chunked body."""
        self.wfile.flush()
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.close_connection = True

    # --- requests -------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._json(404, {"error": {"message": "not here", "type": "invalid_request_error", "param": None, "code": None}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        record = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
        self.server.requests.append(record)
        path = self.path.split("?")[0]
        if path in ("/v1/chat/completions", "/v1/responses"):
            if self.headers.get("Authorization") != f"Bearer {OPENAI_KEY}" or self.headers.get("x-api-key"):
                return self._json(401, {"error": {"message": "Incorrect API key provided.", "type": "invalid_request_error",
                                                  "param": None, "code": "invalid_api_key"}})
            if not isinstance(body, dict) or not isinstance(body.get("model"), str):
                return self._json(400, {"error": {"message": "you must provide a model parameter",
                                                  "type": "invalid_request_error", "param": None, "code": None}})
            if body["model"].endswith("-bad"):
                return self._json(400, {"error": {"message": "The stand-in refuses this request.",
                                                  "type": "invalid_request_error", "param": "model", "code": "standin_refusal"}})
            if path == "/v1/chat/completions":
                return self._chat(body)
            return self._responses(body)
        if path == "/v1/messages":
            if (self.headers.get("x-api-key") != ANTHROPIC_KEY or self.headers.get("Authorization")
                    or not self.headers.get("anthropic-version")):
                return self._json(401, {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}})
            if not isinstance(body, dict) or not isinstance(body.get("max_tokens"), int):
                return self._json(400, {"type": "error", "error": {"type": "invalid_request_error",
                                                                   "message": "max_tokens: Field required"}})
            if body["model"].endswith("-bad"):
                return self._json(400, {"type": "error", "error": {"type": "invalid_request_error",
                                                                   "message": "The stand-in refuses this request."}})
            return self._messages(body)
        self._json(404, {"error": {"message": f"Unknown path {path}", "type": "invalid_request_error", "param": None, "code": None}})

    # --- OpenAI chat completions ----------------------------------------------------------

    def _chat(self, body: Dict[str, Any]) -> None:
        model = body["model"]
        tools = bool(body.get("tools"))
        base = {"id": "chatcmpl-standin1", "created": int(time.time()), "model": model, "system_fingerprint": None}
        if not body.get("stream"):
            if tools:
                message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
                    {"id": "call_standin1", "type": "function", "function": {"name": "get_weather", "arguments": TOOL_ARGS}}]}
                finish = "tool_calls"
            else:
                message = {"role": "assistant", "content": TEXT, "refusal": None}
                finish = "stop"
            return self._json(200, dict(base, object="chat.completion", choices=[
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}], usage=CHAT_USAGE))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self._start_stream()
        chunk = dict(base, object="chat.completion.chunk")

        def send(delta: Dict[str, Any], finish: Optional[str] = None) -> None:
            c = dict(chunk, choices=[{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}])
            if include_usage:
                c["usage"] = None
            self._event(c)

        send({"role": "assistant", "content": ""})
        if model.endswith("-die"):
            send({"content": "Hel"})
            return self._die()
        if tools:
            send({"tool_calls": [{"index": 0, "id": "call_standin1", "type": "function",
                                  "function": {"name": "get_weather", "arguments": ""}}]})
            for p in _pieces(TOOL_ARGS):
                send({"tool_calls": [{"index": 0, "function": {"arguments": p}}]})
            send({}, "tool_calls")
        else:
            for p in _pieces(TEXT):
                send({"content": p})
            send({}, "stop")
        if include_usage:
            self._event(dict(chunk, choices=[], usage=CHAT_USAGE))
        self._event("[DONE]")
        self._end_stream()

    # --- OpenAI responses -----------------------------------------------------------------

    def _responses(self, body: Dict[str, Any]) -> None:
        model = body["model"]
        tools = bool(body.get("tools"))
        if tools:
            item = {"type": "function_call", "id": "fc_standin1", "call_id": "call_standin1", "name": "get_weather",
                    "arguments": TOOL_ARGS, "status": "completed"}
        else:
            item = {"type": "message", "id": "msg_standin1", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": TEXT, "annotations": []}]}

        def response(status: str, output: List[Any], usage: Optional[Dict[str, Any]]) -> Dict[str, Any]:
            return {"id": "resp_standin1", "object": "response", "created_at": int(time.time()), "status": status,
                    "model": model, "output": output, "usage": usage, "error": None, "incomplete_details": None,
                    "instructions": None, "metadata": {}, "parallel_tool_calls": True, "temperature": 1.0,
                    "tool_choice": "auto", "tools": body.get("tools") or [], "top_p": 1.0,
                    "text": {"format": {"type": "text"}}}

        if not body.get("stream"):
            return self._json(200, response("completed", [item], RESP_USAGE))
        self._start_stream()
        seq = iter(range(1000))

        def ev(kind: str, data: Dict[str, Any]) -> None:
            self._event(dict(data, type=kind, sequence_number=next(seq)), kind)

        ev("response.created", {"response": response("in_progress", [], None)})
        ev("response.in_progress", {"response": response("in_progress", [], None)})
        if model.endswith("-die"):
            return self._die()
        if tools:
            ev("response.output_item.added", {"output_index": 0, "item": dict(item, arguments="", status="in_progress")})
            for p in _pieces(TOOL_ARGS):
                ev("response.function_call_arguments.delta", {"item_id": item["id"], "output_index": 0, "delta": p})
            ev("response.function_call_arguments.done", {"item_id": item["id"], "output_index": 0, "arguments": TOOL_ARGS})
            ev("response.output_item.done", {"output_index": 0, "item": item})
        else:
            ev("response.output_item.added", {"output_index": 0, "item": dict(item, content=[], status="in_progress")})
            ev("response.content_part.added", {"item_id": item["id"], "output_index": 0, "content_index": 0,
                                               "part": {"type": "output_text", "text": "", "annotations": []}})
            for p in _pieces(TEXT):
                ev("response.output_text.delta", {"item_id": item["id"], "output_index": 0, "content_index": 0,
                                                  "delta": p, "logprobs": []})
            ev("response.output_text.done", {"item_id": item["id"], "output_index": 0, "content_index": 0,
                                             "text": TEXT, "logprobs": []})
            ev("response.content_part.done", {"item_id": item["id"], "output_index": 0, "content_index": 0,
                                              "part": item["content"][0]})
            ev("response.output_item.done", {"output_index": 0, "item": item})
        ev("response.completed", {"response": response("completed", [item], RESP_USAGE)})
        self._end_stream()

    # --- Anthropic messages ---------------------------------------------------------------

    def _messages(self, body: Dict[str, Any]) -> None:
        model = body["model"]
        tools = bool(body.get("tools"))
        if tools:
            block = {"type": "tool_use", "id": "toolu_standin1", "name": "get_weather", "input": {"city": "Paris"}}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": TEXT}
            stop = "end_turn"
        message = {"id": "msg_standin1", "type": "message", "role": "assistant", "model": model}
        if not body.get("stream"):
            return self._json(200, dict(message, content=[block], stop_reason=stop, stop_sequence=None, usage=MSG_USAGE))
        self._start_stream()
        start_usage = dict(MSG_USAGE, output_tokens=1)
        self._event({"type": "message_start", "message": dict(message, content=[], stop_reason=None,
                                                               stop_sequence=None, usage=start_usage)}, "message_start")
        if tools:
            self._event({"type": "content_block_start", "index": 0, "content_block": dict(block, input={})},
                        "content_block_start")
            self._event({"type": "ping"}, "ping")
            for p in _pieces(TOOL_ARGS):
                self._event({"type": "content_block_delta", "index": 0,
                             "delta": {"type": "input_json_delta", "partial_json": p}}, "content_block_delta")
        else:
            self._event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                        "content_block_start")
            self._event({"type": "ping"}, "ping")
            if model.endswith("-die"):
                return self._die()
            for p in _pieces(TEXT):
                self._event({"type": "content_block_delta", "index": 0,
                             "delta": {"type": "text_delta", "text": p}}, "content_block_delta")
        self._event({"type": "content_block_stop", "index": 0}, "content_block_stop")
        # Cumulative: the first delta's count is replaced by the second's.
        self._event({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                     "usage": {"output_tokens": 4}}, "message_delta")
        self._event({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                     "usage": {"output_tokens": MSG_USAGE["output_tokens"]}}, "message_delta")
        self._event({"type": "message_stop"}, "message_stop")
        self._end_stream()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    requests: List[Dict[str, Any]]


class StandIn:
    """The stand-in, serving in a thread on ``host`` and a free port."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.httpd = _Server((host, 0), Handler)
        self.httpd.requests = []
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def requests(self) -> List[Dict[str, Any]]:
        return self.httpd.requests

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


if __name__ == "__main__":  # a stand-in to try by hand
    s = StandIn()
    print(s.url, flush=True)
    s.thread.join()
