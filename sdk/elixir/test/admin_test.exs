defmodule CellaTest.AdminTest do
  # The operator's routes: workspaces, users, sessions, members, keys.
  use CellaTest.Case

  alias Cella.{Workspace, User, Session, Member, ApiKey}

  test "an organization, a user signed in with a password, made a member, changed, removed" do
    t = tag()

    assert {:ok, %Workspace{id: ws, kind: "organization"}} =
             Workspace.create("org-" <> t, kind: "organization")

    assert {:ok, list} = Workspace.list()
    assert Enum.any?(list, &(&1.id == ws))

    email = "ann-#{t}@example.org"
    assert {:ok, %User{email: ^email, id: uid}} = User.create(email, "Ann", "a long password #{t}")

    assert {:error, %Cella.Error{reason: :unauthorized}} = Session.sign_in(email, "wrong password")

    assert {:ok, %{user: %User{id: ^uid}, config: session}} =
             Session.sign_in(email, "a long password #{t}")

    refute inspect(session) =~ "cella_session"
    assert {:ok, %{user: %User{email: ^email}, workspaces: [_ | _]}} = User.me(config: session)
    # a key is not a session
    assert {:error, %Cella.Error{status: 403}} = User.me()

    assert {:ok, %Member{user_id: ^uid, role: "member"}} = Workspace.add_member(ws, email, "member")
    assert {:ok, %Member{role: "admin"}} = Workspace.update_member(ws, uid, "admin")
    assert {:ok, members} = Workspace.list_members(ws)
    assert Enum.any?(members, &(&1.user_id == uid and &1.role == "admin"))
    assert {:ok, %Member{user_id: ^uid}} = Workspace.remove_member(ws, uid)

    assert :ok = Session.sign_out(config: session)
    assert {:error, %Cella.Error{reason: :unauthorized}} = User.me(config: session)
  end

  test "API keys: made, listed without their secret, revoked" do
    {:ok, key} = ApiKey.create(workspace_id(), name: "listed", scopes: ["sandboxes:read"])
    {:ok, keys} = ApiKey.list()
    listed = Enum.find(keys, &(&1.id == key.id))
    assert listed.name == "listed" and listed.key == nil
    {:ok, _} = ApiKey.revoke(key.id)
    {:ok, keys} = ApiKey.list()
    refute Enum.any?(keys, &(&1.id == key.id))
  end
end
