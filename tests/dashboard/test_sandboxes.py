"""Sandboxes in the browser: the list (state, size, template, age, usage), pause, resume and
destroy, and a terminal over the PTY WebSocket that the session cookie opens, in an
organization workspace (chosen by the cookie the dashboard sets, since a WebSocket carries no
header of its own)."""

from __future__ import annotations

from contextlib import closing

from playwright.sync_api import Browser, expect

from conftest import OWNER, Env, new_page, set_settings, shot, sign_in


def test_a_sandbox_is_listed_paused_resumed_opened_in_a_terminal_and_destroyed(browser: Browser, env: Env) -> None:
    set_settings(env, env.org, compute_rate="0")
    with closing(env.session(OWNER[0])) as s:
        r = s.post("/sandboxes", json={"metadata": {"purpose": "dashboard"}}, headers={"x-cella-workspace": env.org})
        assert r.status_code == 201, r.text
        sid = r.json()["data"]["id"]
    page = new_page(browser)
    sign_in(page, env)
    page.get_by_label("Workspace").select_option(env.org)
    page.get_by_role("navigation").get_by_role("link", name="Sandboxes").click()
    row = page.locator(f'tr[data-sandbox="{sid}"]')
    expect(row.locator(".badge")).to_have_text("running")
    expect(row.locator('td[data-label="Template"]')).to_have_text("base")
    expect(row.locator('td[data-label="Size"]')).to_contain_text("CPU")
    expect(row.locator('td[data-label="Usage"]')).to_contain_text("compute")
    shot(page, "sandboxes")

    row.get_by_role("button", name="Pause").click()
    expect(row.locator(".badge")).to_have_text("paused", timeout=60_000)
    expect(row.get_by_role("link", name="Terminal")).to_have_count(0)
    row.get_by_role("button", name="Resume").click()
    expect(row.locator(".badge")).to_have_text("running", timeout=60_000)

    row.get_by_role("link", name="Terminal").click()
    expect(page.locator(".term-status")).to_have_text("Connected.", timeout=30_000)
    expect(page.locator(".xterm-rows")).to_contain_text("$", timeout=30_000)  # the prompt
    page.locator(".xterm").click()
    page.keyboard.type("echo dash-$((6*7)) in $PWD\n")
    expect(page.locator(".xterm-rows")).to_contain_text("dash-42 in /", timeout=30_000)
    shot(page, "sandbox-terminal")
    page.keyboard.type("exit\n")
    expect(page.locator(".term-status")).to_have_text("The program exited with code 0.", timeout=30_000)

    page.get_by_role("link", name="← Sandboxes").click()
    row = page.locator(f'tr[data-sandbox="{sid}"]')
    row.get_by_role("button", name="Destroy").click()
    confirm = page.get_by_role("alertdialog")
    expect(confirm).to_contain_text("Destroy this sandbox?")
    confirm.get_by_role("button", name="Destroy").click()
    expect(row).to_have_count(0, timeout=60_000)
    page.get_by_label("Show destroyed").check()
    expect(page.locator(f'tr[data-sandbox="{sid}"] .badge')).to_have_text("destroyed")
    assert not page.js_errors, page.js_errors  # type: ignore[attr-defined]
    page.context.close()


def test_the_terminal_on_a_phone(browser: Browser, env: Env) -> None:
    with closing(env.session(OWNER[0])) as s:
        r = s.post("/sandboxes", json={}, headers={"x-cella-workspace": env.owner_personal})
        assert r.status_code == 201, r.text
        sid = r.json()["data"]["id"]
    page = new_page(browser, 390, 844)
    sign_in(page, env)
    page.get_by_label("Workspace").select_option(env.owner_personal)
    page.goto(f"{env.url}/#/sandboxes")
    expect(page.locator(f'tr[data-sandbox="{sid}"] .badge')).to_have_text("running")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    shot(page, "sandboxes-phone")
    page.goto(f"{env.url}/#/sandboxes/{sid}/terminal")
    expect(page.locator(".term-status")).to_have_text("Connected.", timeout=30_000)
    expect(page.locator(".xterm-rows")).to_contain_text("$", timeout=30_000)  # the prompt
    page.locator(".xterm").click()
    page.keyboard.type("echo phone-ok\n")
    expect(page.locator(".xterm-rows")).to_contain_text("phone-ok", timeout=30_000)
    shot(page, "sandbox-terminal-phone")
    with closing(env.session(OWNER[0])) as s:
        s.delete(f"/sandboxes/{sid}", headers={"x-cella-workspace": env.owner_personal})
    page.context.close()
