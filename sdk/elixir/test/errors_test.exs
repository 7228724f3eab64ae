defmodule CellaTest.ErrorsTest do
  # One error case per family, each asserting the typed error a user would match on.
  use CellaTest.Case

  alias Cella.{Sandbox, Commands, Error}

  test "401: an unknown key" do
    assert {:error, %Error{status: 401, code: "UNAUTHORIZED", reason: :unauthorized} = e} =
             Sandbox.list(api_key: "cella_not_a_key")

    assert is_binary(e.request_id)
    assert_raise Error, ~r/UNAUTHORIZED/, fn -> Sandbox.list!(api_key: "cella_not_a_key") end
  end

  test "403: a key without the route's scope" do
    {:ok, key} = Cella.ApiKey.create(workspace_id(), name: "read-only", scopes: ["sandboxes:read"])
    assert is_binary(key.key)

    assert {:error,
            %Error{
              status: 403,
              reason: :forbidden,
              details: %{"required_scope" => "sandboxes:write"}
            }} = Sandbox.create(size: size(), api_key: key.key)

    assert {:ok, _} = Sandbox.list(api_key: key.key)
    assert {:ok, %Cella.ApiKey{id: id}} = Cella.ApiKey.revoke(key.id)
    assert id == key.id
    assert {:error, %Error{reason: :unauthorized}} = Sandbox.list(api_key: key.key)
  end

  test "404: a sandbox that does not exist" do
    assert {:error, %Error{status: 404, code: "NOT_FOUND", reason: :not_found}} =
             Sandbox.get("sb000000000000000000")

    assert {:error, %Error{reason: :not_found}} = Sandbox.connect("sb000000000000000000")
  end

  test "409: a lifecycle call the state does not allow, and a call on a paused sandbox" do
    sb = sandbox!()
    {:ok, paused} = Sandbox.pause(sb)

    assert {:error, %Error{status: 409, reason: :conflict, details: %{"state" => "paused"}}} =
             Sandbox.pause(paused)

    assert {:error, %Error{status: 409, reason: :sandbox_not_running}} =
             Commands.run(paused, "true")

    assert {:error, %Error{status: 409}} = Commands.stream(paused, "true")
  end

  test "413: a body over the server's limit" do
    sb = sandbox!()
    big = String.duplicate("x", 5 * 1024 * 1024)

    assert {:error, %Error{status: 413, code: "PAYLOAD_TOO_LARGE", reason: :payload_too_large}} =
             Commands.run(sb, "true", stdin: big)
  end

  test "429: rate limited, retried after Retry-After, then the typed error" do
    limited =
      CellaTest.Server.start(
        "\n[rate_limits]\nread = { per_second = 1.0, burst = 2 }\n",
        "cella-limited"
      )

    try do
      opts = CellaTest.Server.opts(limited)

      err =
        Enum.find_value(1..20, fn _ ->
          case Sandbox.list([max_retries: 0, limit: 1] ++ opts) do
            {:error, %Error{} = e} -> e
            {:ok, _} -> nil
          end
        end)

      assert %Error{status: 429, code: "RATE_LIMITED", reason: :rate_limited} = err
      assert err.retry_after >= 1 and err.details["group"] == "read"

      # with retries (the default), the call waits for the bucket and succeeds
      assert {:ok, _} = Sandbox.list([limit: 1] ++ opts)
    after
      assert CellaTest.Server.stop(limited) == []
    end
  end
end
