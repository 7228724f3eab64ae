"""Workspaces and money (wallet, credits, ledger, usage, storage), API keys, members, users,
the template catalog and preview tokens, on the session's server; and one typed error per
family of status codes (401, 403, 404, 409, 413; 429 is in test_rate_limits.py)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import date, timedelta
from decimal import Decimal
from typing import Callable, Dict

import pytest

from conftest import Server, ghost

from cella import (
    ApiKey,
    AsyncApiKey,
    AsyncImage,
    AsyncWorkspace,
    AuthenticationError,
    ConflictError,
    Image,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    Sandbox,
    Template,
    User,
    Workspace,
)
from cella.workspaces import amount_text


def test_wallet_credits_and_ledger(server: Server, workspace_id: str, make_key: Callable[..., Dict[str, str]]) -> None:
    before = Workspace.wallet(workspace_id)
    # A workspace's own admin key sees one workspace: no id needed; credits are the operator's.
    own = make_key(["admin"])["key"]
    assert Workspace.wallet(api_key=own) == before
    assert Workspace.get(api_key=own).id == workspace_id
    with pytest.raises(PermissionDeniedError):
        Workspace.add_credits(None, "1", "not the operator", api_key=own)
    assert before.currency == "USD" and before.available == before.balance - before.reserved
    entry = Workspace.add_credits(workspace_id, Decimal("2.500001"), "sdk ledger test")
    assert entry.kind == "credit" and entry.amount == Decimal("2.500001")
    assert entry.balance_after == before.balance + Decimal("2.500001")
    after = Workspace.wallet(workspace_id)
    assert after.balance == before.balance + Decimal("2.500001")
    ledger = Workspace.ledger(workspace_id)
    assert ledger[0].id == entry.id and ledger[0].reference == "sdk ledger test"
    assert sum(e.amount for e in ledger) == after.balance  # the amounts sum to the balance
    assert len(Workspace.ledger(workspace_id, limit=1)) == 1
    with pytest.raises(InvalidRequestError) as bad:
        Workspace.add_credits(workspace_id, "-1", "no")
    assert bad.value.field == "amount"
    with pytest.raises(TypeError):
        Workspace.add_credits(workspace_id, 1.5, "floats are not money")  # type: ignore[arg-type]


def test_usage(server: Server, workspace_id: str) -> None:
    usage = Workspace.usage(workspace_id)
    assert usage.currency == "USD" and usage.from_ is not None and usage.to is not None
    assert usage.totals.compute_cost >= 0
    today = date.today()
    ranged = Workspace.usage(workspace_id, from_=today - timedelta(days=2), to=today)
    assert ranged.from_ is not None and ranged.from_.date() == today - timedelta(days=2)
    with pytest.raises(InvalidRequestError) as bad:
        Workspace.usage(workspace_id, from_="yesterday")
    assert bad.value.field == "from"


def test_workspace_settings_storage_and_members(server: Server, workspace_id: str) -> None:
    ws = Workspace.get(workspace_id)
    assert ws.id == workspace_id and ws.name == "default"
    assert workspace_id in [w.id for w in Workspace.list()]
    limit = ws.settings["session_limit_min"]
    changed = Workspace.update(workspace_id, settings={"session_limit_min": 30})
    assert changed.settings["session_limit_min"] == 30
    assert Workspace.update(workspace_id, settings={"session_limit_min": limit}).settings["session_limit_min"] == limit
    with pytest.raises(InvalidRequestError):
        Workspace.update(workspace_id, settings={"session_limit_min": 0})
    storage = Workspace.storage(workspace_id)
    assert storage.used_bytes >= 0
    # An organization with a member who is a user.
    org = Workspace.create("sdk-org-" + uuid.uuid4().hex[:8], kind="organization")
    email = f"sdk-{uuid.uuid4().hex[:8]}@example.org"
    user = User.create(email, "SDK Tester", "a long enough password 123")
    assert user.email == email
    member = Workspace.add_member(org.id, email, "member")
    assert member.user_id == user.id and member.role == "member"
    assert Workspace.update_member(org.id, user.id, "admin").role == "admin"
    assert [m.email for m in Workspace.members(org.id)] == [email]
    Workspace.remove_member(org.id, user.id)
    assert Workspace.members(org.id) == []
    with pytest.raises(NotFoundError):
        Workspace.get("ws000000000000000000")


def test_api_keys(server: Server, workspace_id: str) -> None:
    made = ApiKey.create("sdk-key", ["sandboxes:read"], workspace_id=workspace_id)
    assert made.key and made.scopes == ["sandboxes:read"] and made.workspace_id == workspace_id
    assert made.id in [k.id for k in ApiKey.list()]
    assert len(Sandbox.list(api_key=made.key, limit=1)) <= 1  # the new key works
    ApiKey.revoke(made.id)
    with pytest.raises(AuthenticationError):
        Sandbox.list(api_key=made.key)


def test_catalog_and_images(server: Server) -> None:
    catalog = Template.list()
    assert "base" in [t.id for t in catalog]
    with pytest.raises(NotFoundError):
        Template.builds("nosuchtemplate")
    assert isinstance(Image.list(), list)
    with pytest.raises(NotFoundError):
        Image.delete("img000000000000000000")


def test_preview_token(shared: Sandbox) -> None:
    tok = shared.preview_token(ttl=60)
    assert tok["token"] and tok["expires_at"]
    rotated = shared.preview_token(rotate=True)
    assert rotated["token"] != tok["token"]


def test_async_workspaces(server: Server, workspace_id: str) -> None:
    async def main() -> None:
        wallet = await AsyncWorkspace.wallet(workspace_id)
        entry = await AsyncWorkspace.add_credits(workspace_id, "1", "async credit")
        assert entry.balance_after == wallet.balance + 1
        assert (await AsyncWorkspace.ledger(workspace_id, limit=1))[0].id == entry.id
        assert (await AsyncWorkspace.usage(workspace_id)).currency == "USD"
        assert (await AsyncWorkspace.get(workspace_id)).id == workspace_id
        assert workspace_id in [w.id for w in await AsyncWorkspace.list()]
        assert (await AsyncWorkspace.storage(workspace_id)).used_bytes >= 0
        ws = await AsyncWorkspace.update(workspace_id, settings={"heartbeat_timeout_sec": 120})
        assert ws.settings["heartbeat_timeout_sec"] == 120
        key = await AsyncApiKey.create("async-key", ["sandboxes:read"], workspace_id=workspace_id)
        assert key.id in [k.id for k in await AsyncApiKey.list()]
        await AsyncApiKey.revoke(key.id)
        assert isinstance(await AsyncImage.list(), list)

    asyncio.run(main())


def test_amounts_are_exact() -> None:
    assert amount_text(Decimal("0.000001")) == "0.000001"
    assert amount_text(12) == "12" and amount_text("3.5") == "3.5"
    with pytest.raises(TypeError):
        amount_text(0.1)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- one error per family


def test_error_families(server: Server, shared: Sandbox, sandbox: Sandbox, make_key: Callable[..., Dict[str, str]]) -> None:
    # 401: an unknown key.
    with pytest.raises(AuthenticationError) as e401:
        Sandbox.list(api_key="not-a-key")
    assert e401.value.status == 401 and e401.value.code == "UNAUTHORIZED"
    # 403: a key without the route's scope.
    reader = make_key(["sandboxes:read"])
    with pytest.raises(PermissionDeniedError) as e403:
        Sandbox.create(api_key=reader["key"], size="xs")
    assert e403.value.status == 403 and e403.value.code == "FORBIDDEN"
    # 404: a sandbox that does not exist.
    with pytest.raises(NotFoundError) as e404:
        ghost().commands.run("true")
    assert e404.value.status == 404 and e404.value.code == "NOT_FOUND"
    # 409: pausing a paused sandbox.
    sandbox.pause()
    with pytest.raises(ConflictError) as e409:
        sandbox.pause()
    assert e409.value.status == 409 and e409.value.details["state"] == "paused"
    # 413: a JSON body over the server's 4 MiB.
    with pytest.raises(PayloadTooLargeError) as e413:
        shared.commands.run("cat > /dev/null", stdin="x" * (5 * 1024 * 1024))
    assert e413.value.status == 413 and e413.value.code == "PAYLOAD_TOO_LARGE"
