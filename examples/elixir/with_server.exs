# Runs an example against a Cella server started for it (CELLA_BIN, a free port, a temporary
# data directory, a random key), with CELLA_SERVER and CELLA_API_KEY set; stops the server
# after, and fails if the example left sandboxes behind. Used by sdk/elixir/run-tests.sh:
#
#   cd sdk/elixir && mix run ../../examples/elixir/with_server.exs ../../examples/elixir/hello.exs
[example] = System.argv()
Code.require_file("../../sdk/elixir/test/support/server.ex", __DIR__)
{:ok, _} = Application.ensure_all_started(:inets)
server = CellaTest.Server.start("", "cella-example")
System.put_env("CELLA_SERVER", server.url)
System.put_env("CELLA_API_KEY", server.api_key)

result =
  try do
    Code.eval_file(example)
    :ok
  rescue
    e -> {:error, Exception.format(:error, e, __STACKTRACE__)}
  end

left = CellaTest.Server.stop(server)

case {result, left} do
  {:ok, []} ->
    :ok

  {:ok, left} ->
    IO.puts(:stderr, "the example left sandboxes behind: #{inspect(left)}")
    System.halt(1)

  {{:error, text}, _} ->
    IO.puts(:stderr, text)
    System.halt(1)
end
