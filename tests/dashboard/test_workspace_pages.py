"""The workspace pages: Settings, Members, API keys and Wallet, in a real browser against the
real server.

These tests make their own organization workspace ("Workshop") and people, so that what they
change (settings, roles, money) touches no other test: an owner, a member and someone to
invite. Each page is saved as a screenshot at 1280x800 and at 390x844."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import ContextManager, Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from conftest import MODEL, PASSWORD, Env, new_page, shot, sign_in

WS_OWNER = ("wanda@example.org", "Wanda Owner")
WS_MEMBER = ("milo@example.org", "Milo Member")
WS_INVITEE = ("ivy@example.org", "Ivy Invitee")
PHONE = (390, 844)


class Shop:
    """The organization workspace of these tests and its people."""

    def __init__(self, env: Env, ws: str) -> None:
        self.env = env
        self.id = ws

    def owner(self) -> ContextManager[httpx.Client]:
        return signed_in(self.env, WS_OWNER[0], self.id)


@contextmanager
def signed_in(env: Env, email: str, workspace: str) -> Iterator[httpx.Client]:
    """An API client signed in as `email`, acting in `workspace`."""
    c = env.session(email)
    c.headers["x-cella-workspace"] = workspace
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def shop(env: Env) -> Iterator[Shop]:
    a = env.admin
    for email, name in (WS_OWNER, WS_MEMBER, WS_INVITEE):
        r = a.post("/users", json={"email": email, "name": name, "password": PASSWORD})
        assert r.status_code == 201, r.text
    r = a.post("/workspaces", json={"name": "Workshop", "plan": "developer", "kind": "organization"})
    assert r.status_code == 201, r.text
    ws = r.json()["data"]["id"]
    for email, role in ((WS_OWNER[0], "owner"), (WS_MEMBER[0], "member")):
        r = a.post(f"/workspaces/{ws}/members", json={"email": email, "role": role})
        assert r.status_code == 201, r.text
    shop = Shop(env, ws)
    yield shop
    # Leave nothing running: the sandboxes of the workspace.
    with shop.owner() as s:
        for sb in s.get("/sandboxes", params={"limit": 1000}).json().get("data", []):
            if sb["state"] != "destroyed":
                s.delete(f"/sandboxes/{sb['id']}")


def open_page(browser: Browser, env: Env, shop: Shop, email: str, page_name: str,
              size: tuple[int, int] = (1280, 800)) -> Page:
    page = new_page(browser, *size)
    sign_in(page, env, email)
    page.get_by_label("Workspace").select_option(shop.id)
    page.get_by_role("navigation").get_by_role("link", name=page_name).click()
    expect(page.get_by_role("heading", level=1, name=page_name)).to_be_visible()
    return page


def close(page: Page) -> None:
    assert not page.js_errors, page.js_errors  # type: ignore[attr-defined]
    page.context.close()


def both_sizes(browser: Browser, env: Env, shop: Shop, email: str, page_name: str, name: str,
               ready: str) -> None:
    """A screenshot of the page at the desktop and the phone size, once `ready` shows."""
    for size, suffix in (((1280, 800), ""), (PHONE, "-phone")):
        page = open_page(browser, env, shop, email, page_name, size)
        expect(page.get_by_text(ready).first).to_be_visible()
        expect(page.get_by_text("Loading…")).to_have_count(0)
        shot(page, f"{name}{suffix}")
        assert not unlabelled(page), unlabelled(page)
        # Nothing of the page is wider than the screen (the tables scroll or turn into cards).
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 1, f"{name}{suffix} is {overflow}px wider than the screen"
        close(page)


def unlabelled(page: Page) -> list:
    """The controls in the page's main part that have no accessible name."""
    return page.evaluate(
        """() => [...document.querySelectorAll('main input, main select, main textarea, main button, main summary')]
            .filter((el) => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                && !el.getAttribute('aria-labelledby') && !(el.textContent || '').trim())
            .map((el) => el.outerHTML.slice(0, 120))"""
    )


def api_as_page(page: Page, method: str, path: str, body: object = None) -> dict:
    """A request from the signed-in page itself (cookie, CSRF token, selected workspace), the
    way a person could try one from the browser's console."""
    return page.evaluate(
        """async ([method, path, body]) => {
            const me = await (await fetch('/api/v1/me')).json();
            const ws = document.getElementById('workspace').value;
            const r = await fetch(path, {method, headers: {'content-type': 'application/json',
                'x-csrf-token': me.data.csrf_token, 'x-cella-workspace': ws},
                body: body === null ? undefined : JSON.stringify(body)});
            return {status: r.status, body: await r.json()};
        }""",
        [method, path, body],
    )


def test_an_owner_changes_the_settings_and_they_stay_after_a_reload(browser: Browser, env: Env, shop: Shop) -> None:
    page = open_page(browser, env, shop, WS_OWNER[0], "Settings")
    expect(page.get_by_label("Enable task runs")).not_to_be_checked()
    expect(page.get_by_label("Session limit (minutes)")).to_have_value("60")
    # A value the API refuses is shown at its field, and nothing changes.
    page.get_by_label("Session limit (minutes)").fill("2000")
    page.get_by_role("button", name="Save settings").click()
    limit = page.get_by_label("Session limit (minutes)")
    expect(limit).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_text("session_limit_min must be from 1 to 1440").first).to_be_visible()
    with shop.owner() as s:
        assert s.get(f"/workspaces/{shop.id}").json()["data"]["settings"]["session_limit_min"] == 60

    page.get_by_label("Enable task runs").check()
    page.get_by_label("Compute rate (per second)").fill("0.0005")
    limit.fill("45")
    page.get_by_label("Heartbeat timeout (seconds)").fill("300")
    page.get_by_label("Model allowlist").fill(f"{MODEL}\nanother-model\n")
    page.get_by_role("button", name="Save settings").click()
    expect(page.get_by_role("status").filter(has_text="Settings saved.")).to_be_visible()
    expect(limit).not_to_have_attribute("aria-invalid", "true")
    # The API's exact decimal comes back into the field.
    expect(page.get_by_label("Compute rate (per second)")).to_have_value("0.000500")

    page.reload()
    expect(page.get_by_role("heading", level=1, name="Settings")).to_be_visible()
    expect(page.get_by_label("Enable task runs")).to_be_checked()
    expect(page.get_by_label("Compute rate (per second)")).to_have_value("0.000500")
    expect(page.get_by_label("Session limit (minutes)")).to_have_value("45")
    expect(page.get_by_label("Heartbeat timeout (seconds)")).to_have_value("300")
    expect(page.get_by_label("Model allowlist")).to_have_value(f"{MODEL}\nanother-model")
    with shop.owner() as s:
        got = s.get(f"/workspaces/{shop.id}").json()["data"]["settings"]
    assert got == {"tasks_enabled": True, "compute_rate": "0.000500", "session_limit_min": 45,
                   "heartbeat_timeout_sec": 300, "model_allowlist": [MODEL, "another-model"]}, got
    # Keyboard: every control of the form is reached with Tab, in order.
    page.get_by_label("Enable task runs").focus()
    order = []
    for _ in range(6):
        order.append(page.evaluate("document.activeElement.id || document.activeElement.textContent"))
        page.keyboard.press("Tab")
    assert order == ["set-tasks", "set-rate", "set-limit", "set-heartbeat", "set-models", "Save settings"], order
    close(page)
    both_sizes(browser, env, shop, WS_OWNER[0], "Settings", "settings", "Enable task runs")


def test_a_member_sees_the_settings_but_no_controls_and_the_api_refuses_them(browser: Browser, env: Env, shop: Shop) -> None:
    page = open_page(browser, env, shop, WS_MEMBER[0], "Settings")
    expect(page.get_by_text("Only owners and admins can change these settings.")).to_be_visible()
    settings = page.get_by_role("main")
    facts = page.get_by_label("Workspace settings")
    expect(facts).to_contain_text("Session limit (minutes)")
    expect(facts).to_contain_text("Compute rate (per second)")
    with shop.owner() as s:
        limit = s.get(f"/workspaces/{shop.id}").json()["data"]["settings"]["session_limit_min"]
    expect(facts).to_contain_text(str(limit))
    for role in ("textbox", "checkbox", "spinbutton", "button", "combobox"):
        expect(settings.get_by_role(role)).to_have_count(0)
    shot(page, "settings-member")
    # The API refuses the member whatever the page shows.
    r = api_as_page(page, "PATCH", f"/api/v1/workspaces/{shop.id}", {"settings": {"tasks_enabled": False}})
    assert r["status"] == 403 and r["body"]["error"]["code"] == "FORBIDDEN", r

    page.get_by_role("navigation").get_by_role("link", name="Members").click()
    expect(page.get_by_role("heading", level=1, name="Members")).to_be_visible()
    expect(page.get_by_role("cell", name=WS_OWNER[0], exact=True)).to_be_visible()
    main = page.get_by_role("main")
    expect(main.get_by_role("button")).to_have_count(0)
    expect(main.get_by_role("combobox")).to_have_count(0)
    expect(main.get_by_role("textbox")).to_have_count(0)
    r = api_as_page(page, "POST", f"/api/v1/workspaces/{shop.id}/members", {"email": WS_INVITEE[0], "role": "member"})
    assert r["status"] == 403, r

    page.get_by_role("navigation").get_by_role("link", name="API keys").click()
    expect(page.get_by_role("heading", level=1, name="API keys")).to_be_visible()
    expect(page.get_by_text("Only owners and admins can see and manage")).to_be_visible()
    expect(main.get_by_role("button")).to_have_count(0)
    expect(main.get_by_role("textbox")).to_have_count(0)
    r = api_as_page(page, "POST", "/api/v1/api-keys", {"workspace_id": shop.id, "name": "mine", "scopes": ["sandboxes:read"]})
    assert r["status"] == 403, r
    with shop.owner() as s:
        k = s.post("/api-keys", json={"workspace_id": shop.id, "name": "owner's", "scopes": ["sandboxes:read"]}).json()["data"]
        r = api_as_page(page, "DELETE", f"/api/v1/api-keys/{k['id']}")
        assert r["status"] == 403, r
        assert httpx.get(env.url + "/api/v1/sandboxes", headers={"Authorization": f"Bearer {k['key']}"}).status_code == 200
        s.delete(f"/api-keys/{k['id']}").raise_for_status()

    page.get_by_role("navigation").get_by_role("link", name="Wallet").click()
    expect(page.get_by_text("Only owners and admins can see this workspace's wallet")).to_be_visible()
    r = api_as_page(page, "GET", f"/api/v1/workspaces/{shop.id}/wallet")
    assert r["status"] in (403, 404), r
    close(page)


def test_an_owner_invites_someone_changes_their_role_and_removes_them(browser: Browser, env: Env, shop: Shop) -> None:
    page = open_page(browser, env, shop, WS_OWNER[0], "Members")
    main = page.get_by_role("main")
    expect(main.get_by_role("cell", name=WS_MEMBER[0], exact=True)).to_be_visible()
    # An email without an account: the API's answer shows.
    page.get_by_label("Email").fill("nobody@example.org")
    page.get_by_role("button", name="Invite").click()
    expect(page.get_by_role("alert")).to_be_visible()
    expect(main.locator("tr[data-member='nobody@example.org']")).to_have_count(0)

    page.get_by_label("Email").fill(WS_INVITEE[0])
    page.get_by_label("Role", exact=True).select_option("member")
    page.get_by_role("button", name="Invite").click()
    expect(page.get_by_role("status").filter(has_text=f"{WS_INVITEE[0]} was added as member.")).to_be_visible()
    role = page.get_by_label(f"Role of {WS_INVITEE[0]}", exact=True)
    expect(role).to_have_value("member")
    # Choosing changes nothing until Save.
    role.select_option("admin")
    with shop.owner() as s:
        roles = {m["email"]: m["role"] for m in s.get(f"/workspaces/{shop.id}/members").json()["data"]}
    assert roles[WS_INVITEE[0]] == "member", roles
    page.get_by_role("button", name=f"Save the role of {WS_INVITEE[0]}").click()
    expect(page.get_by_role("status").filter(has_text=f"{WS_INVITEE[0]} is now admin.")).to_be_visible()
    with shop.owner() as s:
        roles = {m["email"]: m["role"] for m in s.get(f"/workspaces/{shop.id}/members").json()["data"]}
    assert roles == {WS_OWNER[0]: "owner", WS_MEMBER[0]: "member", WS_INVITEE[0]: "admin"}, roles
    # The invitee sees the workspace and, as an admin, its keys.
    with signed_in(env, WS_INVITEE[0], shop.id) as s:
        r = s.get("/api-keys")
        assert r.status_code == 200, r.text

    # The last owner cannot step down: the 409 is shown and the role stays.
    mine = page.get_by_label(f"Role of {WS_OWNER[0]}", exact=True)
    mine.select_option("admin")
    page.get_by_role("button", name=f"Save the role of {WS_OWNER[0]}").click()
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("owner")
    expect(mine).to_have_value("owner")
    shot(page, "members-last-owner")

    page.reload()
    expect(page.get_by_label(f"Role of {WS_INVITEE[0]}", exact=True)).to_have_value("admin")
    both_sizes(browser, env, shop, WS_OWNER[0], "Members", "members", WS_INVITEE[0])

    # Remove asks first; Cancel keeps them, Remove removes them.
    page.get_by_role("button", name=f"Remove {WS_INVITEE[0]}").click()
    dialog = page.get_by_role("alertdialog")
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_have_count(0)
    expect(main.get_by_role("cell", name=WS_INVITEE[0], exact=True)).to_be_visible()
    page.get_by_role("button", name=f"Remove {WS_INVITEE[0]}").click()
    page.get_by_role("alertdialog").get_by_role("button", name="Remove").click()
    expect(page.get_by_role("status").filter(has_text=f"{WS_INVITEE[0]} was removed.")).to_be_visible()
    expect(main.get_by_role("cell", name=WS_INVITEE[0], exact=True)).to_have_count(0)
    with signed_in(env, WS_INVITEE[0], shop.id) as s:
        assert s.get("/api-keys").status_code == 404
    close(page)


def key_row(page: Page, name: str):
    return page.locator("tbody tr", has=page.get_by_role("cell", name=name, exact=True))


def test_an_owner_creates_a_key_sees_it_once_and_revokes_it(browser: Browser, env: Env, shop: Shop) -> None:
    page = open_page(browser, env, shop, WS_OWNER[0], "API keys")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    # No scope: the page says so and makes nothing.
    page.get_by_label("Name").fill("ci")
    page.get_by_role("button", name="Create key").click()
    expect(page.get_by_role("alert")).to_have_text("Pick at least one scope.")

    page.get_by_label("sandboxes:read").check()
    page.get_by_label("sandboxes:write").check()
    page.get_by_role("button", name="Create key").click()
    secret_field = page.get_by_label("New API key")
    expect(secret_field).to_be_visible()
    secret = secret_field.input_value()
    assert len(secret) > 20, secret
    page.get_by_role("button", name="Copy").click()
    expect(page.get_by_text("Copied.")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == secret

    row = key_row(page, "ci")
    expect(row).to_contain_text("sandboxes:read, sandboxes:write")
    prefix = row.locator("code.prefix").inner_text().rstrip("…")
    assert prefix and secret.startswith(prefix) and len(prefix) < len(secret) // 2, (prefix, secret)
    shot(page, "keys-secret")

    # The key works, with its scopes only.
    r = httpx.get(env.url + "/api/v1/sandboxes", headers={"Authorization": f"Bearer {secret}"})
    assert r.status_code == 200, r.text
    r = httpx.get(env.url + "/api/v1/api-keys", headers={"Authorization": f"Bearer {secret}"})
    assert r.status_code == 403, r.text

    # Shown once: after Done, and after a reload, only the prefix is on the page.
    page.get_by_role("button", name="Done").click()
    expect(page.get_by_label("New API key")).to_have_count(0)
    page.reload()
    expect(key_row(page, "ci")).to_contain_text(prefix)
    assert secret not in page.content()
    both_sizes(browser, env, shop, WS_OWNER[0], "API keys", "keys", "Create a key")

    page.get_by_role("button", name="Revoke ci").click()
    dialog = page.get_by_role("alertdialog")
    expect(dialog).to_contain_text(prefix)
    # Esc closes the question and revokes nothing.
    page.keyboard.press("Escape")
    expect(dialog).to_have_count(0)
    assert httpx.get(env.url + "/api/v1/sandboxes", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    page.get_by_role("button", name="Revoke ci").click()
    page.get_by_role("alertdialog").get_by_role("button", name="Revoke").click()
    expect(page.get_by_role("status").filter(has_text='The key "ci" was revoked.')).to_be_visible()
    expect(page.locator("tr", has_text=prefix)).to_have_count(0)
    # A plain request with the revoked key: 401.
    r = httpx.get(env.url + "/api/v1/sandboxes", headers={"Authorization": f"Bearer {secret}"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHORIZED", r.text
    close(page)


def test_the_wallet_shows_a_credit_the_ledger_and_the_daily_cost(browser: Browser, env: Env, shop: Shop) -> None:
    a = env.admin
    r = a.post(f"/workspaces/{shop.id}/wallet/credits", json={"amount": "40.500000", "reference": "invoice 2026-12"})
    assert r.status_code == 201, r.text
    with shop.owner() as s:
        # Some use, so the chart has bars: a sandbox's compute (at the workspace's rate, the
        # 60-second minimum) and a model request through the gateway with a models:use key.
        s.patch(f"/workspaces/{shop.id}", json={"settings": {"compute_rate": "0.001000", "model_allowlist": []}}).raise_for_status()
        sb = s.post("/sandboxes", json={})
        assert sb.status_code == 201, sb.text
        s.delete(f"/sandboxes/{sb.json()['data']['id']}").raise_for_status()
        k = s.post("/api-keys", json={"workspace_id": shop.id, "name": "model", "scopes": ["models:use"]})
        assert k.status_code == 201, k.text
        key = k.json()["data"]["key"]
        r = httpx.post(env.url + "/gateway/openai/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                       json={"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}, timeout=60)
        assert r.status_code == 200, r.text
        s.delete(f"/api-keys/{k.json()['data']['id']}").raise_for_status()
        # The sandbox's charge is written when it settles, just after the destroy.
        for _ in range(120):
            ledger = s.get(f"/workspaces/{shop.id}/ledger").json()["data"]
            kinds = [e["kind"] for e in ledger]
            if "compute" in kinds and "model" in kinds:
                break
            time.sleep(0.25)
        assert kinds[-1] == "credit" and "compute" in kinds and "model" in kinds, kinds
        wallet = s.get(f"/workspaces/{shop.id}/wallet").json()["data"]
        usage = s.get(f"/workspaces/{shop.id}/usage").json()["data"]

    page = open_page(browser, env, shop, WS_OWNER[0], "Wallet")
    cards = page.get_by_label("Wallet", exact=True)
    def shown(amount: str) -> str:
        whole, frac = amount.split(".")
        frac = frac.rstrip("0").ljust(2, "0")
        return f"{int(whole):,}.{frac} USD"
    expect(cards.locator("[data-figure=balance] dd").first).to_have_text(shown(wallet["balance"]))
    expect(cards.locator("[data-figure=reserved] dd").first).to_have_text(shown(wallet["reserved"]))
    expect(cards.locator("[data-figure=available] dd").first).to_have_text(shown(wallet["available"]))
    credit = page.locator("tr", has_text="invoice 2026-12")
    expect(credit).to_contain_text("credit")
    expect(credit).to_contain_text("40.50 USD")
    expect(page.locator("tr[data-entry]")).to_have_count(len(ledger))

    # The chart: an image with a text alternative, a bar of each kind, and the same figures
    # as a table.
    chart = page.get_by_role("img", name="Daily compute and model cost")
    expect(chart).to_be_visible()
    label = chart.get_attribute("aria-label") or ""
    totals = usage["totals"]
    assert shown(totals["compute_cost"]) in label and shown(totals["model_cost"]) in label, (label, totals)
    expect(page.locator("svg.bars rect.compute")).to_have_count(1)
    expect(page.locator("svg.bars rect.model")).to_have_count(1)
    page.get_by_text("The figures as a table").click()
    figures = page.get_by_role("table", name="Daily compute and model cost")
    today = usage["days"][-1]
    expect(figures).to_contain_text(today["date"])
    expect(figures).to_contain_text(shown(today["compute_cost"]))
    close(page)
    both_sizes(browser, env, shop, WS_OWNER[0], "Wallet", "wallet", "invoice 2026-12")


def test_the_ledger_is_paginated(browser: Browser, env: Env, shop: Shop) -> None:
    a = env.admin
    for i in range(30):
        r = a.post(f"/workspaces/{shop.id}/wallet/credits", json={"amount": "0.010000", "reference": f"top-up {i:02d}"})
        assert r.status_code == 201, r.text
    page = open_page(browser, env, shop, WS_OWNER[0], "Wallet")
    rows = page.locator("tr[data-entry]")
    expect(rows).to_have_count(25)
    expect(rows.first).to_contain_text("top-up 29")
    expect(page.get_by_role("button", name="Newer")).to_be_disabled()
    page.get_by_role("button", name="Older").click()
    expect(page.get_by_text("Page 2")).to_be_visible()
    expect(rows.first).to_contain_text("top-up 04")
    expect(page.locator("tr", has_text="invoice 2026-12")).to_be_visible()
    page.get_by_role("button", name="Newer").click()
    expect(rows.first).to_contain_text("top-up 29")
    close(page)
