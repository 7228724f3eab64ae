defmodule Cella.Workspace do
  @moduledoc """
  Workspaces (tenants): their settings, wallet, ledger, usage, storage and members.

      {:ok, wallet} = Cella.Workspace.wallet(workspace_id)
      wallet.available  #=> "12.500000"

  Amounts are decimal strings with 6 decimals, as the server sends them.
  """
  import Cella, only: [defbang: 1]
  alias Cella.{HTTP, Wallet, LedgerEntry, WorkspaceUsage, Storage, Member}

  use Cella.Model, [:id, :name, :plan, :kind, :created_at, settings: %{}]

  defp id_of(%__MODULE__{id: id}), do: id
  defp id_of(id) when is_binary(id), do: id
  defp wpath(ws, rest \\ ""), do: "/workspaces/" <> HTTP.seg(id_of(ws)) <> rest

  defp one({:ok, d}, mod), do: {:ok, mod.from_map(d)}
  defp one(e, _), do: e

  @doc "Workspaces (the operator: every one; a workspace's admin key: its own)."
  def list(opts \\ []) do
    {c, o} = Cella.split_opts(opts)
    Cella.pages(c, "/workspaces", [], o[:limit], __MODULE__)
  end

  @doc "Creates a workspace (the operator only): `name`, and `plan:`, `kind:`."
  def create(name, opts \\ []) do
    {c, o} = Cella.split_opts(opts)
    body = %{name: name} |> put(:plan, o[:plan]) |> put(:kind, o[:kind])
    one(HTTP.data(c, :post, "/workspaces", json: body), __MODULE__)
  end

  @doc "One workspace."
  def get(ws, opts \\ []) do
    {c, _} = Cella.split_opts(opts)
    one(HTTP.data(c, :get, wpath(ws)), __MODULE__)
  end

  @doc """
  Changes a workspace: `name:`, `plan:` (the operator's), `settings:` (a partial map merged
  into the current settings, e.g. `%{tasks_enabled: true}`).
  """
  def update(ws, opts) do
    {c, o} = Cella.split_opts(opts)
    body = %{} |> put(:name, o[:name]) |> put(:plan, o[:plan]) |> put(:settings, o[:settings])
    one(HTTP.data(c, :patch, wpath(ws), json: body), __MODULE__)
  end

  @doc "The wallet: balance, reserved, available."
  def wallet(ws, opts \\ []) do
    {c, _} = Cella.split_opts(opts)
    one(HTTP.data(c, :get, wpath(ws, "/wallet")), Wallet)
  end

  @doc "Adds funds (the operator only): `amount` a decimal string, `reference:` a note."
  def credit(ws, amount, opts \\ []) do
    {c, o} = Cella.split_opts(opts)
    body = %{amount: amount, reference: o[:reference] || "credit"}
    one(HTTP.data(c, :post, wpath(ws, "/wallet/credits"), json: body), LedgerEntry)
  end

  @doc "The ledger's entries, newest first (`limit:`, default every page)."
  def ledger(ws, opts \\ []) do
    {c, o} = Cella.split_opts(opts)
    Cella.pages(c, wpath(ws, "/ledger"), [], o[:limit], LedgerEntry)
  end

  @doc "Usage per UTC day in `[from, to)` (`from:`, `to:`: RFC 3339 times, dates or `Date`s)."
  def usage(ws, opts \\ []) do
    {c, o} = Cella.split_opts(opts)
    params = [from: stamp(o[:from]), to: stamp(o[:to])]
    one(HTTP.data(c, :get, wpath(ws, "/usage"), params: params), WorkspaceUsage)
  end

  @doc "What the workspace stores against its storage quota."
  def storage(ws, opts \\ []) do
    {c, _} = Cella.split_opts(opts)
    one(HTTP.data(c, :get, wpath(ws, "/storage")), Storage)
  end

  @doc "The workspace's members, in the order they joined."
  def list_members(ws, opts \\ []) do
    {c, o} = Cella.split_opts(opts)
    Cella.pages(c, wpath(ws, "/members"), [], o[:limit], Member)
  end

  @doc "Adds an existing user (by email) to an organization workspace with a role."
  def add_member(ws, email, role, opts \\ []) do
    {c, _} = Cella.split_opts(opts)
    one(HTTP.data(c, :post, wpath(ws, "/members"), json: %{email: email, role: role}), Member)
  end

  @doc "Changes a member's role."
  def update_member(ws, user_id, role, opts \\ []) do
    {c, _} = Cella.split_opts(opts)

    one(
      HTTP.data(c, :patch, wpath(ws, "/members/" <> HTTP.seg(user_id)), json: %{role: role}),
      Member
    )
  end

  @doc "Removes a member (or, for a signed-in user removing themselves, leaves)."
  def remove_member(ws, user_id, opts \\ []) do
    {c, _} = Cella.split_opts(opts)
    one(HTTP.data(c, :delete, wpath(ws, "/members/" <> HTTP.seg(user_id))), Member)
  end

  defp put(m, _k, nil), do: m
  defp put(m, k, v), do: Map.put(m, k, v)

  defp stamp(nil), do: nil
  defp stamp(%Date{} = d), do: Date.to_iso8601(d)
  defp stamp(%DateTime{} = d), do: DateTime.to_iso8601(d)
  defp stamp(s), do: to_string(s)

  defbang(
    list: [0, 1],
    create: [1, 2],
    get: [1, 2],
    update: 2,
    wallet: [1, 2],
    credit: [2, 3],
    ledger: [1, 2],
    usage: [1, 2],
    storage: [1, 2],
    list_members: [1, 2],
    add_member: [3, 4],
    update_member: [3, 4],
    remove_member: [2, 3]
  )
end

defmodule Cella.Member do
  @moduledoc "A member of a workspace: `user_id`, `email`, `name`, `role`."
  use Cella.Model, [:user_id, :email, :name, :role]
end

defmodule Cella.ApiKey do
  @moduledoc """
  API keys of a workspace (scope `admin`). `key`, the secret, is set only in the answer of
  `create/3`.
  """
  import Cella, only: [defbang: 1]
  alias Cella.HTTP

  use Cella.Model, [
    :id,
    :workspace_id,
    :name,
    :scopes,
    :prefix,
    :key,
    :created_at,
    :expires_at,
    :last_used_at
  ]

  @doc "Makes a key of `workspace_id` with `scopes:` (a list) and `name:` (and `expires_at:`)."
  def create(workspace_id, opts) do
    {c, o} = Cella.split_opts(opts)

    body =
      %{workspace_id: workspace_id, name: o[:name] || "sdk", scopes: o[:scopes]}
      |> then(fn b -> if o[:expires_at], do: Map.put(b, :expires_at, o[:expires_at]), else: b end)

    with {:ok, d} <- HTTP.data(c, :post, "/api-keys", json: body), do: {:ok, from_map(d)}
  end

  @doc "The keys that are not revoked (never their secrets)."
  def list(opts \\ []) do
    {c, o} = Cella.split_opts(opts)
    Cella.pages(c, "/api-keys", [], o[:limit], __MODULE__)
  end

  @doc "Revokes a key: it gets 401 from the next request on."
  def revoke(id, opts \\ []) do
    {c, _} = Cella.split_opts(opts)
    with {:ok, d} <- HTTP.data(c, :delete, "/api-keys/" <> HTTP.seg(id)), do: {:ok, from_map(d)}
  end

  defbang(create: 2, list: [0, 1], revoke: [1, 2])
end

defmodule Cella.User do
  @moduledoc "Users (people who sign in with an email and a password)."
  import Cella, only: [defbang: 1]
  alias Cella.HTTP

  use Cella.Model, [:id, :email, :name, :created_at]

  @doc "Makes a user with their personal workspace (the operator; anyone with open sign-up)."
  def create(email, name, password, opts \\ []) do
    {c, _} = Cella.split_opts(opts)
    body = %{email: email, name: name, password: password}
    with {:ok, d} <- HTTP.data(c, :post, "/users", json: body), do: {:ok, from_map(d)}
  end

  @doc """
  The signed-in user, their workspaces with their role in each, and the session's CSRF token
  (a session only: pass the `Cella.Session.sign_in/3` answer's `:config`).
  """
  def me(opts \\ []) do
    {c, _} = Cella.split_opts(opts)

    with {:ok, d} <- HTTP.data(c, :get, "/me") do
      {:ok,
       %{user: from_map(d["user"]), workspaces: d["workspaces"] || [], csrf_token: d["csrf_token"]}}
    end
  end

  defbang(create: [3, 4], me: [0, 1])
end

defmodule Cella.Session do
  @moduledoc """
  Signing in with an email and a password, for programs that act as a person rather than
  with an API key. The answer's `config` carries the session cookie and CSRF token; pass it
  as `config:` to other calls.
  """
  import Cella, only: [defbang: 1]
  alias Cella.{HTTP, JSON}

  @doc "Signs in: `{:ok, %{user, csrf_token, expires_at, config}}`."
  def sign_in(email, password, opts \\ []) do
    {c, _} = Cella.split_opts(opts)
    c = %{c | api_key: nil}

    with {:ok, r} <- HTTP.request(c, :post, "/sessions", json: %{email: email, password: password}),
         {:ok, %{"data" => d}} <- JSON.decode(r.body) do
      cookie =
        Enum.find_value(r.headers, fn
          {"set-cookie", "cella_session=" <> _ = v} -> v |> String.split(";") |> hd()
          _ -> nil
        end)

      headers = [{"cookie", cookie}, {"x-csrf-token", d["csrf_token"]}]

      {:ok,
       %{
         user: Cella.User.from_map(d["user"]),
         csrf_token: d["csrf_token"],
         expires_at: d["expires_at"],
         config: %{c | headers: c.headers ++ headers}
       }}
    end
  end

  @doc "Signs out (`config:` of the session)."
  def sign_out(opts) do
    {c, _} = Cella.split_opts(opts)
    with {:ok, _} <- HTTP.request(c, :delete, "/sessions/current"), do: :ok
  end

  defbang(sign_in: [2, 3], sign_out: 1)
end
