"""The shell: sign in and out, the navigation, the workspace switcher, what the server serves."""

from __future__ import annotations

import httpx
from playwright.sync_api import Browser, expect

from conftest import MEMBER, OWNER, PASSWORD, Env, new_page, shot, sign_in

NAV = ["Task runs", "Sandboxes", "Settings", "Members", "API keys", "Wallet"]


def test_the_page_is_served_with_a_strict_policy(env: Env) -> None:
    r = httpx.get(env.url + "/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert r.headers["cache-control"] == "no-cache"
    csp = r.headers["content-security-policy"]
    assert "script-src 'self';" in csp and "frame-ancestors 'none'" in csp
    assert "<script>" not in r.text
    # The API's answers stay JSON, unknown routes included, even for a browser.
    r = httpx.get(env.url + "/api/v1/nope", headers={"accept": "text/html"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND"


def test_sign_in_shows_the_navigation_and_sign_out_ends_the_session(browser: Browser, env: Env) -> None:
    page = new_page(browser)
    page.goto(env.url + "/")
    expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    shot(page, "signin")
    page.get_by_label("Email").fill(OWNER[0])
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("Wrong email or password.")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    nav = page.get_by_role("navigation")
    for name in NAV:
        expect(nav.get_by_role("link", name=name)).to_be_visible()
    expect(page.get_by_role("heading", name="Task runs")).to_be_visible()
    expect(page.get_by_text(OWNER[1], exact=True)).to_be_visible()
    # A reload keeps the session (the cookie).
    page.reload()
    expect(page.get_by_role("heading", name="Task runs")).to_be_visible()
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    page.reload()
    expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    assert not page.js_errors, page.js_errors  # type: ignore[attr-defined]
    page.context.close()


def test_the_workspace_switcher_lists_personal_and_organization_workspaces(browser: Browser, env: Env) -> None:
    page = new_page(browser)
    sign_in(page, env)
    switcher = page.get_by_label("Workspace")
    expect(switcher).to_have_value(env.owner_personal)
    options = switcher.locator("option")
    expect(options).to_have_count(2)
    switcher.select_option(env.org)
    expect(page).to_have_title("Task runs · Acme · Cella")
    # The choice holds across a reload.
    page.reload()
    expect(page.get_by_label("Workspace")).to_have_value(env.org)
    page.get_by_label("Workspace").select_option(env.owner_personal)
    expect(page.get_by_label("Workspace")).to_have_value(env.owner_personal)
    assert not page.js_errors, page.js_errors  # type: ignore[attr-defined]
    page.context.close()


def test_a_member_signs_in_too(browser: Browser, env: Env) -> None:
    page = new_page(browser)
    sign_in(page, env, MEMBER[0])
    expect(page.get_by_role("heading", name="Task runs")).to_be_visible()
    page.context.close()
