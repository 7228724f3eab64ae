defmodule CellaTest.ServerTest do
  use CellaTest.Case

  test "health and the OpenAPI document; every operation in operations.txt is in it" do
    assert {:ok, %{"status" => "ok"}} = Cella.health()
    assert {:ok, %{"paths" => paths}} = Cella.openapi()

    ops =
      for {path, methods} <- paths,
          {m, _} <- methods,
          m in ~w(get post put patch delete),
          into: MapSet.new(),
          do: {String.upcase(m), Regex.replace(~r/\{[^}]+\}/, path, "{}")}

    lines =
      Path.expand("../operations.txt", __DIR__)
      |> File.read!()
      |> String.split("\n", trim: true)
      |> Enum.reject(&String.starts_with?(&1, "#"))

    for line <- lines do
      [op, symbol] = String.split(line, "\t")
      [method, path] = String.split(op, " ")
      assert {method, Regex.replace(~r/\{[^}]+\}/, path, "{}")} in ops, line
      # the symbol is a public function of the SDK
      {mod, [fun]} = symbol |> String.split(".") |> Enum.split(-1)
      mod = Module.concat(mod)
      assert Code.ensure_loaded?(mod), symbol
      assert Enum.any?(mod.__info__(:functions), fn {f, _} -> Atom.to_string(f) == fun end), symbol
    end
  end
end
