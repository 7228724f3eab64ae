defmodule CellaTest.Case do
  @moduledoc "Helpers of the tests: the server, sandboxes destroyed after each test."
  use ExUnit.CaseTemplate

  @size "xs"

  using do
    quote do
      import CellaTest.Case
    end
  end

  def server, do: :persistent_term.get(:cella_test_server)
  def repos, do: :persistent_term.get(:cella_test_repos)
  def size, do: @size

  @doc "A fresh running sandbox, destroyed when the test ends."
  def sandbox!(opts \\ []) do
    sb = Cella.Sandbox.create!([size: @size, timeout: 600] ++ opts)
    ExUnit.Callbacks.on_exit(fn -> Cella.Sandbox.kill(sb) end)
    sb
  end

  @doc "The default workspace's id."
  def workspace_id do
    Cella.Workspace.list!() |> Enum.find(&(&1.name == "default")) |> Map.fetch!(:id)
  end

  def tag, do: :crypto.strong_rand_bytes(6) |> Base.encode16(case: :lower)
end
