// Cella's MCP endpoint (`/mcp`, streamable HTTP) driven by the official TypeScript SDK
// (@modelcontextprotocol/sdk). Run with CELLA_SERVER and CELLA_API_KEY (an admin key) set, as
// tests/mcp/run-tests.sh does through sdk/python/tests/cella_server.py.
import assert from "node:assert/strict";
import { test, after } from "node:test";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const SERVER = process.env.CELLA_SERVER;
const ADMIN = process.env.CELLA_API_KEY;
assert.ok(SERVER && ADMIN, "CELLA_SERVER and CELLA_API_KEY must be set");

async function api(method, path, body) {
  const r = await fetch(`${SERVER}/api/v1${path}`, {
    method,
    headers: { Authorization: `Bearer ${ADMIN}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const j = await r.json();
  assert.ok(r.ok, `${method} ${path}: ${r.status} ${JSON.stringify(j)}`);
  return j.data;
}

const ws = await api("POST", "/workspaces", { name: "mcp-ts", plan: "developer", kind: "organization" });
const key = async (scopes) =>
  (await api("POST", "/api-keys", { workspace_id: ws.id, name: "mcp-ts", scopes })).key;
const fullKey = await key(["sandboxes:read", "sandboxes:write", "sandboxes:exec", "tasks:read", "tasks:write"]);
const noExecKey = await key(["sandboxes:read", "sandboxes:write"]);

const clients = [];
async function connect(k) {
  const transport = new StreamableHTTPClientTransport(new URL(`${SERVER}/mcp`), {
    requestInit: { headers: { Authorization: `Bearer ${k}` } },
  });
  const client = new Client({ name: "cella-mcp-ts-test", version: "0.0.0" });
  await client.connect(transport);
  clients.push(client);
  return client;
}

after(async () => {
  for (const c of clients) await c.close().catch(() => {});
});

const texts = (r) => r.content.filter((b) => b.type === "text").map((b) => b.text).join("\n");

async function callOk(c, name, args, opts) {
  const r = await c.callTool({ name, arguments: args }, undefined, opts);
  assert.ok(!r.isError, `${name} failed: ${texts(r)}`);
  assert.equal(typeof r.structuredContent, "object");
  return r;
}

test("a whole session: tools, a sandbox, a command, a file, a plot, destroy", { timeout: 300_000 }, async () => {
  const c = await connect(fullKey);
  assert.ok(c.getServerVersion()?.name === "cella");
  const tools = (await c.listTools()).tools;
  const names = tools.map((t) => t.name).sort();
  assert.deepEqual(names, [
    "exec", "expose_port", "file_list", "file_read", "file_write", "run_code", "sandbox_create",
    "sandbox_destroy", "sandbox_list", "task_cancel", "task_get", "task_start",
  ]);
  for (const t of tools) {
    assert.equal(t.inputSchema.type, "object");
    assert.equal(t.outputSchema.type, "object");
  }

  const sb = (await callOk(c, "sandbox_create", {})).structuredContent.sandbox;
  try {
    assert.equal(sb.state, "running");
    let progress = 0;
    const r = await callOk(
      c, "exec",
      { sandbox_id: sb.id, command: "echo one; sleep 0.8; echo two >&2; exit 5" },
      { onprogress: () => { progress += 1; } },
    );
    assert.equal(r.structuredContent.exit_code, 5);
    assert.equal(r.structuredContent.stdout, "one\n");
    assert.equal(r.structuredContent.stderr, "two\n");
    assert.ok(progress > 0, "no progress notification");

    await callOk(c, "file_write", { sandbox_id: sb.id, path: "/home/user/t.txt", content: "from node\n" });
    const f = await callOk(c, "file_read", { sandbox_id: sb.id, path: "/home/user/t.txt" });
    assert.equal(f.structuredContent.content, "from node\n");

    const res = await c.readResource({ uri: `cella://sandboxes/${sb.id}/files/home/user/t.txt` });
    assert.equal(res.contents[0].text, "from node\n");

    const code = [
      "import matplotlib", "matplotlib.use('Agg')", "import matplotlib.pyplot as plt",
      "plt.bar(['a', 'b'], [3, 5])", "plt.show()",
    ].join("\n");
    const cell = await callOk(c, "run_code", { sandbox_id: sb.id, code });
    const img = cell.content.find((b) => b.type === "image");
    assert.ok(img, `no image content: ${JSON.stringify(cell.content).slice(0, 300)}`);
    assert.equal(img.mimeType, "image/png");
    assert.deepEqual([...Buffer.from(img.data, "base64").subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47]);
  } finally {
    const d = await callOk(c, "sandbox_destroy", { sandbox_id: sb.id });
    assert.equal(d.structuredContent.sandbox.state, "destroyed");
  }
});

test("a key without sandboxes:exec neither sees nor runs exec", { timeout: 120_000 }, async () => {
  const c = await connect(noExecKey);
  const names = (await c.listTools()).tools.map((t) => t.name);
  assert.ok(!names.includes("exec") && !names.includes("run_code") && !names.includes("file_write"), names.join());
  assert.ok(names.includes("sandbox_create"));
  const r = await c.callTool({ name: "exec", arguments: { sandbox_id: "sbxnothere", command: "id" } });
  assert.equal(r.isError, true);
  assert.match(texts(r), /FORBIDDEN.*sandboxes:exec/);
  // The session goes on.
  assert.ok((await c.listTools()).tools.length === names.length);
});

test("bad arguments are tool errors, never a protocol failure or a dropped session", { timeout: 120_000 }, async () => {
  const c = await connect(fullKey);
  for (const [name, args] of [
    ["exec", { sandbox_id: "sbxnothere" }],
    ["exec", { sandbox_id: "sbxnothere", command: "ls", extra: true }],
    ["file_read", { sandbox_id: ["x"], path: "/" }],
    ["sandbox_create", { size: "huge" }],
    ["task_get", { task_id: "a/../b" }],
  ]) {
    const r = await c.callTool({ name, arguments: args });
    assert.equal(r.isError, true, `${name} ${JSON.stringify(args)}`);
    assert.ok(!/INTERNAL/.test(texts(r)), texts(r));
  }
  assert.equal((await c.listTools()).tools.length, 12);
});
