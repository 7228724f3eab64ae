defmodule CellaTest.ReadmeTest do
  # The README's first example runs as it is (against the suite's server, found through
  # CELLA_SERVER and CELLA_API_KEY as the README says).
  use CellaTest.Case

  import ExUnit.CaptureIO

  test "the README's first example runs and cleans up after itself" do
    readme = File.read!(Path.expand("../README.md", __DIR__))
    [_, code | _] = String.split(readme, ~r/```elixir\n|```\n/, parts: 3)
    assert code =~ "Sandbox.create"
    t = tag()
    before = Cella.Sandbox.list!() |> Enum.map(& &1.id)
    out = capture_io(fn -> Code.eval_string(code) end)
    assert out =~ "hello from"
    assert out =~ "1\n2\n3\n"
    assert out =~ "1.414"
    after_ids = Cella.Sandbox.list!() |> Enum.map(& &1.id)
    assert after_ids -- before == [], "the example left a sandbox running (#{t})"
  end
end
