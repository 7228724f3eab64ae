"""Workspaces and their money: settings, the wallet, the ledger and usage; members, API keys,
users and imported images. :class:`Workspace`, :class:`ApiKey`, :class:`User` and
:class:`Image` have the blocking calls, the ``Async...`` classes the same on asyncio::

    from cella import Workspace

    wallet = Workspace.wallet()                 # the key's own workspace
    print(wallet.available, wallet.currency)    # exact Decimals
    for entry in Workspace.ledger(limit=10):
        print(entry.at, entry.kind, entry.amount)

A workspace id may be left out when the key sees exactly one workspace (a workspace's own
key does). Reading the wallet, ledger and usage needs the ``admin`` scope; adding credits is
for the operator (the server's bootstrap key). Every call takes the connection keywords of
:meth:`cella.Sandbox.create` (``server``, ``api_key``, ``max_retries``, ``request_timeout``,
``headers``).
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Any, BinaryIO, Dict, List, Mapping, Optional, Sequence, Union

from ._common import seg
from ._transport import AsyncTransport, SyncTransport
from .async_resources import connect as aconnect, list_pages as alist_pages
from .models import (
    ApiKeyInfo,
    ImageInfo,
    LedgerEntry,
    MemberInfo,
    UserInfo,
    Wallet,
    WorkspaceInfo,
    WorkspaceStorage,
    WorkspaceUsage,
)
from .resources import connect, list_pages

__all__ = ["Workspace", "AsyncWorkspace", "ApiKey", "AsyncApiKey", "User", "AsyncUser", "Image", "AsyncImage"]

Amount = Union[str, int, Decimal]
When = Union[str, date, datetime, None]
WorkspaceRef = Union[str, WorkspaceInfo, None]


def amount_text(amount: Amount) -> str:
    """An amount as the server takes it: a decimal string. Floats are refused (money is exact)."""
    if isinstance(amount, bool) or isinstance(amount, float):
        raise TypeError("amounts are exact: pass a str, an int or a Decimal, not a float")
    if isinstance(amount, Decimal):
        return format(amount, "f")
    if isinstance(amount, int):
        return str(amount)
    if isinstance(amount, str):
        return amount
    raise TypeError("an amount is a str, an int or a Decimal")


def when_text(value: When) -> Optional[str]:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return value.isoformat()


def _only_workspace(page: Mapping[str, Any]) -> str:
    data = page.get("data") or []
    if len(data) != 1 or page.get("next_cursor"):
        raise ValueError("this key sees several workspaces: name the workspace (workspace_id=...)")
    return str(data[0]["id"])


def _ws(t: SyncTransport, ref: WorkspaceRef) -> str:
    if isinstance(ref, WorkspaceInfo):
        return ref.id
    if ref is not None:
        return str(ref)
    return _only_workspace(t.request("GET", "/workspaces", params={"limit": 2}).json())


async def _aws(t: AsyncTransport, ref: WorkspaceRef) -> str:
    if isinstance(ref, WorkspaceInfo):
        return ref.id
    if ref is not None:
        return str(ref)
    return _only_workspace((await t.request("GET", "/workspaces", params={"limit": 2})).json())


def _wpath(ws: str, *rest: str) -> str:
    return "/workspaces/" + seg(ws) + "".join("/" + r for r in rest)


def _update_body(name: Optional[str], plan: Optional[str], settings: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if name is not None:
        body["name"] = name
    if plan is not None:
        body["plan"] = plan
    if settings is not None:
        body["settings"] = {k: (amount_text(v) if isinstance(v, Decimal) else v) for k, v in settings.items()}
    return body


def _create_body(name: str, plan: Optional[str], kind: Optional[str]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"name": name}
    if plan is not None:
        body["plan"] = plan
    if kind is not None:
        body["kind"] = kind
    return body


def _key_body(workspace: str, name: str, scopes: Sequence[str], expires_at: When) -> Dict[str, Any]:
    body: Dict[str, Any] = {"workspace_id": workspace, "name": name, "scopes": [str(s) for s in scopes]}
    if expires_at is not None:
        body["expires_at"] = when_text(expires_at)
    return body


class Workspace:
    """Workspaces (the operator sees every one; a workspace's key its own), their settings,
    storage, members and money."""

    @staticmethod
    def list(*, limit: Optional[int] = None, **connection: Any) -> List[WorkspaceInfo]:
        t = connect(**connection)
        try:
            return [WorkspaceInfo.from_dict(d) for d in list_pages(t, "/workspaces", {}, limit)]
        finally:
            t.close()

    @staticmethod
    def get(workspace_id: WorkspaceRef = None, **connection: Any) -> WorkspaceInfo:
        t = connect(**connection)
        try:
            return WorkspaceInfo.from_dict(t.data("GET", _wpath(_ws(t, workspace_id))))
        finally:
            t.close()

    @staticmethod
    def create(name: str, *, plan: Optional[str] = None, kind: Optional[str] = None, **connection: Any) -> WorkspaceInfo:
        """Make a workspace (operator)."""
        t = connect(**connection)
        try:
            return WorkspaceInfo.from_dict(t.data("POST", "/workspaces", json=_create_body(name, plan, kind)))
        finally:
            t.close()

    @staticmethod
    def update(workspace_id: WorkspaceRef = None, *, name: Optional[str] = None, plan: Optional[str] = None,
               settings: Optional[Mapping[str, Any]] = None, **connection: Any) -> WorkspaceInfo:
        """Change a workspace's name, plan or ``settings`` (only the settings given change),
        e.g. ``settings={"tasks_enabled": True, "compute_rate": "0.001"}``."""
        t = connect(**connection)
        try:
            ws = _ws(t, workspace_id)
            return WorkspaceInfo.from_dict(t.data("PATCH", _wpath(ws), json=_update_body(name, plan, settings)))
        finally:
            t.close()

    @staticmethod
    def storage(workspace_id: WorkspaceRef = None, **connection: Any) -> WorkspaceStorage:
        t = connect(**connection)
        try:
            return WorkspaceStorage.from_dict(t.data("GET", _wpath(_ws(t, workspace_id), "storage")))
        finally:
            t.close()

    # -------------------------------------------------------------- money

    @staticmethod
    def wallet(workspace_id: WorkspaceRef = None, **connection: Any) -> Wallet:
        """The wallet: ``balance``, ``reserved`` and ``available`` (exact Decimals)."""
        t = connect(**connection)
        try:
            return Wallet.from_dict(t.data("GET", _wpath(_ws(t, workspace_id), "wallet")))
        finally:
            t.close()

    @staticmethod
    def add_credits(workspace_id: WorkspaceRef, amount: Amount, reference: str, **connection: Any) -> LedgerEntry:
        """Add funds (operator only): answers the new ``credit`` ledger entry."""
        t = connect(**connection)
        try:
            ws = _ws(t, workspace_id)
            body = {"amount": amount_text(amount), "reference": reference}
            return LedgerEntry.from_dict(t.data("POST", _wpath(ws, "wallet", "credits"), json=body))
        finally:
            t.close()

    @staticmethod
    def ledger(workspace_id: WorkspaceRef = None, *, limit: Optional[int] = None, **connection: Any) -> List[LedgerEntry]:
        """The ledger's entries, newest first (every page, or the first ``limit``)."""
        t = connect(**connection)
        try:
            return [LedgerEntry.from_dict(d) for d in list_pages(t, _wpath(_ws(t, workspace_id), "ledger"), {}, limit)]
        finally:
            t.close()

    @staticmethod
    def usage(workspace_id: WorkspaceRef = None, *, from_: When = None, to: When = None, **connection: Any) -> WorkspaceUsage:
        """Usage per UTC day over ``[from_, to)`` (dates or times; default the last 30 days)."""
        t = connect(**connection)
        try:
            params = {"from": when_text(from_), "to": when_text(to)}
            return WorkspaceUsage.from_dict(t.data("GET", _wpath(_ws(t, workspace_id), "usage"), params=params))
        finally:
            t.close()

    # -------------------------------------------------------------- members

    @staticmethod
    def members(workspace_id: WorkspaceRef = None, **connection: Any) -> List[MemberInfo]:
        t = connect(**connection)
        try:
            return [MemberInfo.from_dict(d) for d in list_pages(t, _wpath(_ws(t, workspace_id), "members"), {}, None)]
        finally:
            t.close()

    @staticmethod
    def add_member(workspace_id: WorkspaceRef, email: str, role: str = "member", **connection: Any) -> MemberInfo:
        """Add an existing user (by email) with a ``role``: ``owner``, ``admin`` or ``member``."""
        t = connect(**connection)
        try:
            ws = _ws(t, workspace_id)
            return MemberInfo.from_dict(t.data("POST", _wpath(ws, "members"), json={"email": email, "role": role}))
        finally:
            t.close()

    @staticmethod
    def update_member(workspace_id: WorkspaceRef, user_id: str, role: str, **connection: Any) -> MemberInfo:
        t = connect(**connection)
        try:
            ws = _ws(t, workspace_id)
            return MemberInfo.from_dict(t.data("PATCH", _wpath(ws, "members", seg(user_id)), json={"role": role}))
        finally:
            t.close()

    @staticmethod
    def remove_member(workspace_id: WorkspaceRef, user_id: str, **connection: Any) -> None:
        t = connect(**connection)
        try:
            t.request("DELETE", _wpath(_ws(t, workspace_id), "members", seg(user_id)))
        finally:
            t.close()


class AsyncWorkspace:
    """Workspaces and their money on asyncio; see :class:`Workspace`."""

    @staticmethod
    async def list(*, limit: Optional[int] = None, **connection: Any) -> List[WorkspaceInfo]:
        t = aconnect(**connection)
        try:
            return [WorkspaceInfo.from_dict(d) for d in await alist_pages(t, "/workspaces", {}, limit)]
        finally:
            await t.aclose()

    @staticmethod
    async def get(workspace_id: WorkspaceRef = None, **connection: Any) -> WorkspaceInfo:
        t = aconnect(**connection)
        try:
            return WorkspaceInfo.from_dict(await t.data("GET", _wpath(await _aws(t, workspace_id))))
        finally:
            await t.aclose()

    @staticmethod
    async def create(name: str, *, plan: Optional[str] = None, kind: Optional[str] = None, **connection: Any) -> WorkspaceInfo:
        t = aconnect(**connection)
        try:
            return WorkspaceInfo.from_dict(await t.data("POST", "/workspaces", json=_create_body(name, plan, kind)))
        finally:
            await t.aclose()

    @staticmethod
    async def update(workspace_id: WorkspaceRef = None, *, name: Optional[str] = None, plan: Optional[str] = None,
                     settings: Optional[Mapping[str, Any]] = None, **connection: Any) -> WorkspaceInfo:
        t = aconnect(**connection)
        try:
            ws = await _aws(t, workspace_id)
            return WorkspaceInfo.from_dict(await t.data("PATCH", _wpath(ws), json=_update_body(name, plan, settings)))
        finally:
            await t.aclose()

    @staticmethod
    async def storage(workspace_id: WorkspaceRef = None, **connection: Any) -> WorkspaceStorage:
        t = aconnect(**connection)
        try:
            return WorkspaceStorage.from_dict(await t.data("GET", _wpath(await _aws(t, workspace_id), "storage")))
        finally:
            await t.aclose()

    @staticmethod
    async def wallet(workspace_id: WorkspaceRef = None, **connection: Any) -> Wallet:
        t = aconnect(**connection)
        try:
            return Wallet.from_dict(await t.data("GET", _wpath(await _aws(t, workspace_id), "wallet")))
        finally:
            await t.aclose()

    @staticmethod
    async def add_credits(workspace_id: WorkspaceRef, amount: Amount, reference: str, **connection: Any) -> LedgerEntry:
        t = aconnect(**connection)
        try:
            ws = await _aws(t, workspace_id)
            body = {"amount": amount_text(amount), "reference": reference}
            return LedgerEntry.from_dict(await t.data("POST", _wpath(ws, "wallet", "credits"), json=body))
        finally:
            await t.aclose()

    @staticmethod
    async def ledger(workspace_id: WorkspaceRef = None, *, limit: Optional[int] = None, **connection: Any) -> List[LedgerEntry]:
        t = aconnect(**connection)
        try:
            ws = await _aws(t, workspace_id)
            return [LedgerEntry.from_dict(d) for d in await alist_pages(t, _wpath(ws, "ledger"), {}, limit)]
        finally:
            await t.aclose()

    @staticmethod
    async def usage(workspace_id: WorkspaceRef = None, *, from_: When = None, to: When = None, **connection: Any) -> WorkspaceUsage:
        t = aconnect(**connection)
        try:
            ws = await _aws(t, workspace_id)
            params = {"from": when_text(from_), "to": when_text(to)}
            return WorkspaceUsage.from_dict(await t.data("GET", _wpath(ws, "usage"), params=params))
        finally:
            await t.aclose()

    @staticmethod
    async def members(workspace_id: WorkspaceRef = None, **connection: Any) -> List[MemberInfo]:
        t = aconnect(**connection)
        try:
            ws = await _aws(t, workspace_id)
            return [MemberInfo.from_dict(d) for d in await alist_pages(t, _wpath(ws, "members"), {}, None)]
        finally:
            await t.aclose()

    @staticmethod
    async def add_member(workspace_id: WorkspaceRef, email: str, role: str = "member", **connection: Any) -> MemberInfo:
        t = aconnect(**connection)
        try:
            ws = await _aws(t, workspace_id)
            return MemberInfo.from_dict(await t.data("POST", _wpath(ws, "members"), json={"email": email, "role": role}))
        finally:
            await t.aclose()

    @staticmethod
    async def update_member(workspace_id: WorkspaceRef, user_id: str, role: str, **connection: Any) -> MemberInfo:
        t = aconnect(**connection)
        try:
            ws = await _aws(t, workspace_id)
            return MemberInfo.from_dict(await t.data("PATCH", _wpath(ws, "members", seg(user_id)), json={"role": role}))
        finally:
            await t.aclose()

    @staticmethod
    async def remove_member(workspace_id: WorkspaceRef, user_id: str, **connection: Any) -> None:
        t = aconnect(**connection)
        try:
            ws = await _aws(t, workspace_id)
            await t.request("DELETE", _wpath(ws, "members", seg(user_id)))
        finally:
            await t.aclose()


class ApiKey:
    """API keys (scope ``admin``). The secret is only in the answer of :meth:`create`
    (``ApiKeyInfo.key``)."""

    @staticmethod
    def create(name: str, scopes: Sequence[str], *, workspace_id: WorkspaceRef = None, expires_at: When = None,
               **connection: Any) -> ApiKeyInfo:
        t = connect(**connection)
        try:
            body = _key_body(_ws(t, workspace_id), name, scopes, expires_at)
            return ApiKeyInfo.from_dict(t.data("POST", "/api-keys", json=body))
        finally:
            t.close()

    @staticmethod
    def list(*, limit: Optional[int] = None, **connection: Any) -> List[ApiKeyInfo]:
        t = connect(**connection)
        try:
            return [ApiKeyInfo.from_dict(d) for d in list_pages(t, "/api-keys", {}, limit)]
        finally:
            t.close()

    @staticmethod
    def revoke(key_id: str, **connection: Any) -> None:
        t = connect(**connection)
        try:
            t.request("DELETE", "/api-keys/" + seg(key_id))
        finally:
            t.close()


class AsyncApiKey:
    """API keys on asyncio; see :class:`ApiKey`."""

    @staticmethod
    async def create(name: str, scopes: Sequence[str], *, workspace_id: WorkspaceRef = None, expires_at: When = None,
                     **connection: Any) -> ApiKeyInfo:
        t = aconnect(**connection)
        try:
            body = _key_body(await _aws(t, workspace_id), name, scopes, expires_at)
            return ApiKeyInfo.from_dict(await t.data("POST", "/api-keys", json=body))
        finally:
            await t.aclose()

    @staticmethod
    async def list(*, limit: Optional[int] = None, **connection: Any) -> List[ApiKeyInfo]:
        t = aconnect(**connection)
        try:
            return [ApiKeyInfo.from_dict(d) for d in await alist_pages(t, "/api-keys", {}, limit)]
        finally:
            await t.aclose()

    @staticmethod
    async def revoke(key_id: str, **connection: Any) -> None:
        t = aconnect(**connection)
        try:
            await t.request("DELETE", "/api-keys/" + seg(key_id))
        finally:
            await t.aclose()


class User:
    """Dashboard users (operator, or anyone when the server has open sign-up)."""

    @staticmethod
    def create(email: str, name: str, password: str, **connection: Any) -> UserInfo:
        """Make a user (and their personal workspace)."""
        t = connect(**connection)
        try:
            return UserInfo.from_dict(t.data("POST", "/users", json={"email": email, "name": name, "password": password}))
        finally:
            t.close()


class AsyncUser:
    """Dashboard users on asyncio; see :class:`User`."""

    @staticmethod
    async def create(email: str, name: str, password: str, **connection: Any) -> UserInfo:
        t = aconnect(**connection)
        try:
            return UserInfo.from_dict(await t.data("POST", "/users", json={"email": email, "name": name, "password": password}))
        finally:
            await t.aclose()


class Image:
    """Container images imported into the workspace (an OCI or ``docker save`` tar), for
    templates built ``from`` them."""

    @staticmethod
    def list(*, limit: Optional[int] = None, **connection: Any) -> List[ImageInfo]:
        t = connect(**connection)
        try:
            return [ImageInfo.from_dict(d) for d in list_pages(t, "/images", {}, limit)]
        finally:
            t.close()

    @staticmethod
    def import_tar(data: Union[bytes, BinaryIO], *, name: Optional[str] = None, **connection: Any) -> ImageInfo:
        """Upload an image tar (bytes or a file opened in binary mode)."""
        t = connect(**connection)
        try:
            return ImageInfo.from_dict(t.data("POST", "/images", params={"name": name}, content=data,
                                              headers={"Content-Type": "application/x-tar"}, timeout=None))
        finally:
            t.close()

    @staticmethod
    def delete(image_id: str, **connection: Any) -> ImageInfo:
        t = connect(**connection)
        try:
            return ImageInfo.from_dict(t.data("DELETE", "/images/" + seg(image_id)))
        finally:
            t.close()


class AsyncImage:
    """Imported images on asyncio; see :class:`Image`."""

    @staticmethod
    async def list(*, limit: Optional[int] = None, **connection: Any) -> List[ImageInfo]:
        t = aconnect(**connection)
        try:
            return [ImageInfo.from_dict(d) for d in await alist_pages(t, "/images", {}, limit)]
        finally:
            await t.aclose()

    @staticmethod
    async def import_tar(data: Union[bytes, BinaryIO], *, name: Optional[str] = None, **connection: Any) -> ImageInfo:
        t = aconnect(**connection)
        try:
            return ImageInfo.from_dict(await t.data("POST", "/images", params={"name": name}, content=data,
                                                    headers={"Content-Type": "application/x-tar"}, timeout=None))
        finally:
            await t.aclose()

    @staticmethod
    async def delete(image_id: str, **connection: Any) -> ImageInfo:
        t = aconnect(**connection)
        try:
            return ImageInfo.from_dict(await t.data("DELETE", "/images/" + seg(image_id)))
        finally:
            await t.aclose()
