"""Task runs in the browser: the Start dialog (its checks and the API's refusals), a run started
from it going queued -> running -> stopped live, its page (timeline, live log, branch), and Stop
with its confirmation."""

from __future__ import annotations

import subprocess
from contextlib import closing

from playwright.sync_api import Browser, Page, expect

from conftest import OWNER, RATE, REPOSITORY, Env, new_page, set_settings, shot, sign_in

# Collects, in the page, every state word each run's row shows, in order (the page is never
# reloaded, so this sees what a person watching it sees).
WATCH_STATES = """() => {
  window.__seen = {};
  const note = () => {
    for (const tr of document.querySelectorAll('tr[data-task]')) {
      const s = tr.querySelector('.badge')?.textContent;
      const seen = (window.__seen[tr.dataset.task] ||= []);
      if (s && seen[seen.length - 1] !== s) seen.push(s);
    }
  };
  new MutationObserver(note).observe(document.body, {subtree: true, childList: true, characterData: true});
  note();
}"""


def enable_tasks(env: Env, workspace: str, rate: str = RATE) -> None:
    set_settings(env, workspace, tasks_enabled=True, compute_rate=rate)


def open_start(page: Page):
    page.get_by_role("button", name="Start", exact=True).click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_be_visible()
    return dialog


def test_the_start_dialog_checks_its_fields_and_shows_the_apis_refusals(browser: Browser, env: Env) -> None:
    page = new_page(browser)
    sign_in(page, env)
    page.get_by_label("Workspace").select_option(env.org)
    expect(page.get_by_text("Task runs are off in this workspace.")).to_be_visible()
    dialog = open_start(page)
    # The keyboard: focus starts in Repository, Tab stays in the dialog, Esc closes it.
    expect(dialog.get_by_label("Repository")).to_be_focused()
    for _ in range(8):
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.closest('dialog') !== null")
    page.keyboard.press("Escape")
    expect(page.get_by_role("dialog")).to_have_count(0)

    dialog = open_start(page)
    dialog.get_by_role("button", name="Start").click()
    expect(dialog.get_by_text("Name the repository.")).to_be_visible()
    expect(dialog.get_by_text("Say what the agent should do.")).to_be_visible()
    expect(dialog.get_by_label("Repository")).to_have_attribute("aria-invalid", "true")
    dialog.get_by_label("Repository").fill("not a repository")
    dialog.get_by_label("Task").fill("Add a notes file.")
    dialog.get_by_role("button", name="Start").click()
    expect(dialog.get_by_text("A repository is owner/name")).to_be_visible()

    # Task runs off in this workspace: the API's 403 in words, with the way out.
    dialog.get_by_label("Repository").fill(REPOSITORY)
    dialog.get_by_role("button", name="Start").click()
    alert = dialog.get_by_role("alert")
    expect(alert).to_contain_text("Task runs are not enabled for this workspace.")
    expect(alert.get_by_role("link", name="Turn them on in Settings.")).to_be_visible()
    shot(page, "tasks-start-disabled")

    # Turned on with a rate the empty wallet cannot cover: the 402 with the figures.
    enable_tasks(env, env.org, rate="1.000000")
    dialog.get_by_role("button", name="Start").click()
    expect(alert).to_contain_text("The wallet is too low for this run.")
    expect(alert).to_contain_text("It needs 3,600.10 USD reserved and 0.00 USD is available.")
    shot(page, "tasks-start-wallet-low")
    set_settings(env, env.org, tasks_enabled=False, compute_rate="0")

    # An unknown repository (in a workspace that can pay): named at its field.
    page.keyboard.press("Escape")
    page.get_by_label("Workspace").select_option(env.owner_personal)
    enable_tasks(env, env.owner_personal)
    dialog = open_start(page)
    dialog.get_by_label("Repository").fill("acme/nothing-here")
    dialog.get_by_label("Task").fill("Add a notes file.")
    dialog.get_by_role("button", name="Start").click()
    expect(dialog.get_by_role("alert")).to_contain_text("Unknown repository or branch.")
    expect(dialog.get_by_label("Repository")).to_have_attribute("aria-invalid", "true")
    # And a base branch that does not exist.
    dialog.get_by_label("Repository").fill(REPOSITORY)
    dialog.get_by_label("Base branch").fill("no-such-branch")
    dialog.get_by_role("button", name="Start").click()
    expect(dialog.get_by_label("Base branch")).to_have_attribute("aria-invalid", "true")
    shot(page, "tasks-start-unknown-branch")
    with closing(env.session(OWNER[0])) as s:
        listed = s.get("/tasks", headers={"x-cella-workspace": env.owner_personal}).json()["data"]
        assert [t for t in listed if t["repository"] == "acme/nothing-here"] == []
    assert not page.js_errors, page.js_errors  # type: ignore[attr-defined]
    page.context.close()


def test_a_run_started_from_the_dialog_goes_queued_running_stopped_live(browser: Browser, env: Env) -> None:
    enable_tasks(env, env.owner_personal)
    page = new_page(browser)
    sign_in(page, env)
    page.get_by_label("Workspace").select_option(env.owner_personal)
    expect(page.get_by_role("heading", name="Task runs")).to_be_visible()
    page.evaluate(WATCH_STATES)
    dialog = open_start(page)
    dialog.get_by_label("Repository").fill(REPOSITORY)
    dialog.get_by_label("Base branch").fill("main")
    dialog.get_by_label("Task").fill("Add a notes file.")
    shot(page, "tasks-start-dialog")
    dialog.get_by_role("button", name="Start").click()
    expect(page.get_by_role("dialog")).to_have_count(0)
    row = page.locator("tr[data-task]").first
    task_id = row.get_attribute("data-task")
    assert task_id
    expect(row.locator(".badge")).to_have_text("running", timeout=120_000)

    # Its page, in a second tab while it runs: the live log, the timeline.
    run = page.context.new_page()
    run.goto(f"{env.url}/#/tasks/{task_id}")
    expect(run.get_by_role("heading", name=REPOSITORY)).to_be_visible()
    expect(run.get_by_label("Agent output")).to_contain_text("step 2: write_file", timeout=60_000)
    expect(run.get_by_role("heading", name=REPOSITORY).locator(".badge")).to_have_text("running")
    shot(run, "task-running")

    expect(row.locator(".badge")).to_have_text("stopped", timeout=180_000)
    seen = page.evaluate(f"window.__seen[{task_id!r}]")
    assert seen[0] == "queued" and "running" in seen and seen[-1] == "stopped", seen
    assert seen.index("running") < seen.index("stopped")
    # The hand-off of a git forge is the branch; the costs are in their own columns.
    branch = f"cella/{task_id}"
    expect(row.get_by_text(branch)).to_be_visible()
    expect(row.locator('td[data-label="Compute cost"]')).to_have_text("0.06 USD")
    expect(row.locator('td[data-label="Model cost"]')).not_to_have_text("0.00 USD")
    expect(row.locator('td[data-label="Compute time"]')).to_contain_text("s")
    shot(page, "tasks")

    expect(run.get_by_role("heading", name=REPOSITORY).locator(".badge")).to_have_text("stopped")
    timeline = run.get_by_label("States")
    expect(timeline).to_contain_text("queued")
    expect(timeline).to_contain_text("running")
    expect(timeline).to_contain_text("stopped")
    expect(run.get_by_text("The run has ended. Its output is not kept.")).to_be_visible()
    expect(run.get_by_text(branch).first).to_be_visible()
    shot(run, "task-stopped")
    # The branch is on the forge, with the agent's commit.
    out = subprocess.run(["git", "--git-dir", str(env.repos / f"{REPOSITORY}.git"), "log", "--format=%s", branch],
                         capture_output=True, text=True, check=True).stdout
    assert "Add notes" in out, out
    assert not page.js_errors, page.js_errors  # type: ignore[attr-defined]
    page.context.close()


def test_a_running_run_is_stopped_after_a_confirmation(browser: Browser, env: Env) -> None:
    enable_tasks(env, env.owner_personal)
    with closing(env.session(OWNER[0])) as s:
        r = s.post("/tasks", json={"repository": REPOSITORY, "task": "Sleep.", "agent": "sleeper"},
                   headers={"x-cella-workspace": env.owner_personal})
        assert r.status_code == 201, r.text
        task_id = r.json()["data"]["id"]
    page = new_page(browser)
    sign_in(page, env)
    page.get_by_label("Workspace").select_option(env.owner_personal)
    row = page.locator(f'tr[data-task="{task_id}"]')
    expect(row.locator(".badge")).to_have_text("running", timeout=120_000)
    # Cancel in the confirmation changes nothing.
    row.get_by_role("button", name="Stop").click()
    confirm = page.get_by_role("alertdialog")
    expect(confirm).to_contain_text("Stop this run?")
    shot(page, "tasks-stop-confirm")
    confirm.get_by_role("button", name="Cancel").click()
    expect(page.get_by_role("alertdialog")).to_have_count(0)
    with closing(env.session(OWNER[0])) as s:
        assert s.get(f"/tasks/{task_id}", headers={"x-cella-workspace": env.owner_personal}).json()["data"]["state"] == "running"
    row.get_by_role("button", name="Stop").click()
    page.get_by_role("alertdialog").get_by_role("button", name="Stop run").click()
    expect(row.locator(".badge")).to_have_text("cancelled", timeout=120_000)
    expect(row.get_by_role("button", name="Stop")).to_have_count(0)
    with closing(env.session(OWNER[0])) as s:
        t = s.get(f"/tasks/{task_id}", headers={"x-cella-workspace": env.owner_personal}).json()["data"]
        assert t["state"] == "cancelled" and t["stop_reason"] == "cancelled", t
    page.context.close()


def test_the_task_list_on_a_phone(browser: Browser, env: Env) -> None:
    page = new_page(browser, 390, 844)
    sign_in(page, env)
    page.get_by_label("Workspace").select_option(env.owner_personal)
    expect(page.locator("tr[data-task]").first).to_be_visible()
    # No sideways scrolling: the table became cards.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    shot(page, "tasks-phone")
    page.context.close()
