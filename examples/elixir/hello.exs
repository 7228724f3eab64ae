# A first program with the Elixir SDK: a sandbox, a command, a streamed command, a file, a
# code cell with a chart, and a one-shot run. Run it from sdk/elixir with the server in
# CELLA_SERVER and a key in CELLA_API_KEY:
#
#   cd sdk/elixir && mix run ../../examples/elixir/hello.exs
alias Cella.{Sandbox, Commands, Files, Code}

{:ok, sb} = Sandbox.create(size: "xs", timeout: 600)
IO.puts("sandbox #{sb.id} is #{sb.state}")

try do
  {:ok, r} = Commands.run(sb, "uname -sr && python3 --version")
  IO.write(r.stdout)

  # Output as the command writes it.
  {:ok, stream} = Commands.stream(sb, "for i in 1 2 3; do echo step $i; sleep 0.2; done")

  for item <- stream do
    case item do
      %Cella.OutputChunk{stream: :stdout, data: d} -> IO.write("  live: " <> d)
      %Cella.OutputChunk{stream: :stderr, data: d} -> IO.write(:stderr, d)
      %Cella.CommandResult{exit_code: code} -> IO.puts("  exited #{code}")
    end
  end

  {:ok, _} = Files.write(sb, "/home/user/data.csv", "x,y\n1,3\n2,1\n3,2\n")

  {:ok, ex} =
    Code.run(sb, """
    import pandas as pd, matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    df = pd.read_csv("/home/user/data.csv")
    df.plot(x="x", y="y")
    plt.show()
    df["y"].sum()
    """)

  IO.puts("sum of y: #{ex.result}")
  png = Cella.Execution.output(ex, "image/png")
  IO.puts("chart: #{byte_size(Cella.Output.bytes(png))} bytes of PNG")
after
  Sandbox.kill(sb)
end

# A one-shot run: a sandbox made, used and destroyed in one call; its artifacts kept.
{:ok, run} =
  Sandbox.run("wc -l < words.txt > count.txt",
    files: %{"words.txt" => "a\nb\nc\n"},
    artifacts: ["count.txt"],
    size: "xs"
  )

[artifact] = run.artifacts

IO.puts(
  "one-shot run: exit #{run.exit_code}, count = #{String.trim(Cella.Artifact.download!(artifact))}"
)
