"""A stand-in model for the built-in agent: OpenAI chat completions (non-streaming) with tool
calls, scripted from the conversation so far (so any number of runs can use it at once).

Turn 1 runs ``echo starting; sleep 4`` (the run page opens before the first lines of its
live log), turn 2 writes NOTES.md (the agent
commits it), turn 3 runs ``sleep 8`` (the run stays ``running`` long enough to be seen), turn 4
calls ``finish``. Every answer reports usage, so
the run gets a model cost.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict

KEY = "sk-dashboard-standin"
MODEL = "standin-coder"

TURNS = [
    ("run_command", {"command": "echo starting; sleep 4", "timeout_sec": 30}),
    ("write_file", {"path": "NOTES.md", "content": "Notes from the dashboard test.\n",
                    "commit_message": "Add notes"}),
    ("run_command", {"command": "echo working on it; sleep 8; echo done", "timeout_sec": 30}),
    ("finish", {"summary": "Added NOTES.md."}),
]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, status: int, body: Dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.endswith("/models"):
            self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "standin"}]})
        else:
            self._json(404, {"error": {"message": "not found", "type": "invalid_request_error"}})

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"{}")
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            self._json(401, {"error": {"message": "bad key", "type": "invalid_request_error"}})
            return
        if not self.path.endswith("/chat/completions"):
            self._json(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
            return
        done = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        name, args = TURNS[min(done, len(TURNS) - 1)]
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{done}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}
        self._json(200, {
            "id": f"chatcmpl-{done}", "object": "chat.completion", "created": 0, "model": body.get("model", MODEL),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 200, "completion_tokens": 40, "total_tokens": 240},
        })


class StandInCoder:
    def __init__(self) -> None:
        # Sandboxes reach the model through the server's gateway, so localhost is enough.
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
