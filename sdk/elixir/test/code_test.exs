defmodule CellaTest.CodeTest do
  use CellaTest.Case

  alias Cella.{Code, Execution, Output}

  setup_all do
    sb = Cella.Sandbox.create!(size: size(), timeout: 1800)
    on_exit(fn -> Cella.Sandbox.kill(sb) end)
    %{sb: sb}
  end

  test "a matplotlib figure comes back as a PNG", %{sb: sb} do
    code =
      "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()"

    assert {:ok, %Execution{ok: true} = ex} = Code.run(sb, code, timeout: 120)
    assert %Output{mime: "image/png"} = png = Execution.output(ex, "image/png")
    assert <<0x89, "PNG\r\n", 0x1A, "\n", _::binary>> = Output.bytes(png)
  end

  test "contexts keep state; a failing cell is an execution error", %{sb: sb} do
    assert Code.run!(sb, "x = 20", context: "elixir").ok
    assert Code.run!(sb, "x + 22", context: "elixir").result == "42"

    assert %Execution{ok: false, error: %Cella.ExecutionError{name: "ZeroDivisionError"}} =
             Code.run!(sb, "1/0")

    assert Code.run!(sb, "[1, 2].map(x => x * 2)", language: "javascript").result == "[ 2, 4 ]"
    assert {:ok, ctxs} = Code.contexts(sb)
    assert Enum.any?(ctxs, &(&1.name == "elixir"))
    assert {:ok, %Cella.CodeContext{name: "other"}} = Code.create_context(sb, name: "other")
    assert {:ok, true} = Code.reset_context(sb, "elixir")

    assert %Execution{ok: false, error: %{name: "NameError"}} =
             Code.run!(sb, "x", context: "elixir")

    assert {:ok, kernels} = Code.state(sb)
    assert Enum.any?(kernels, &(&1.language == "python" and &1.running))
    assert {:ok, _} = Code.reset(sb, language: "javascript")
    assert {:error, %Cella.Error{reason: :unknown_language}} = Code.run(sb, "1", language: "cobol")
  end
end
