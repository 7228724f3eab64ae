defmodule CellaTest.Server do
  @moduledoc """
  Starts and stops a real Cella server for the tests: `$CELLA_BIN` (else the workspace's
  `target/debug/cella`) on a free port of 127.0.0.1, with a temporary data directory and a
  random bootstrap (operator) key. `stop/1` destroys every sandbox left (sandboxes outlive
  their server otherwise), stops the server with SIGTERM and removes its directory.
  """

  defstruct [:url, :api_key, :dir, :log, :port, :os_pid]

  # Servers that keep a pool of pre-booted sandboxes get it turned off; older servers refuse
  # `[pool]`: the first configuration the server takes is used.
  @candidates ["[pool]\ndefault = 0\nsizes = {}\n", "[pool]\ndefault = 0\n", ""]

  def binary do
    bin = System.get_env("CELLA_BIN") || Path.expand("../../../target/debug/cella", __DIR__)
    bin = Path.expand(bin)

    unless File.regular?(bin),
      do: raise("no Cella server binary at #{bin}: set CELLA_BIN to target/debug/cella")

    bin
  end

  def start(extra \\ "", name \\ "cella") do
    bin = binary()

    dir =
      Path.join(
        System.tmp_dir!(),
        "#{name}-elixir-sdk-#{System.unique_integer([:positive])}-#{rand(4)}"
      )

    File.mkdir_p!(dir)
    key = "test-" <> rand(16)
    try_start(bin, dir, key, extra, @candidates, "")
  end

  defp try_start(_bin, dir, _key, _extra, [], last_log) do
    File.rm_rf(dir)
    raise "the Cella server did not start:\n" <> String.slice(last_log, -3000, 3000)
  end

  defp try_start(bin, dir, key, extra, [candidate | rest], _) do
    port = free_port()
    config = Path.join(dir, "config.toml")
    log = Path.join(dir, "server.log")
    File.write!(config, candidate <> extra)

    # The shell is a watchdog: it starts the server, says its pid, and stops it when its own
    # standard input (the port) closes, so a test run that dies does not leave it running.
    script =
      ~s("$0" serve --listen "$1" --data-dir "$2" --config "$3" >"$4" 2>&1 </dev/null & ) <>
        ~s(pid=$!; echo "pid $pid"; read _ignored; kill -TERM $pid 2>/dev/null; wait $pid)

    p =
      Port.open({:spawn_executable, "/bin/sh"}, [
        :binary,
        :exit_status,
        args: ["-c", script, bin, "127.0.0.1:#{port}", Path.join(dir, "data"), config, log],
        env: [{~c"CELLA_BOOTSTRAP_KEY", String.to_charlist(key)}, {~c"CELLA_API_KEY", false}]
      ])

    os_pid =
      receive do
        {^p, {:data, "pid " <> rest}} -> rest |> String.trim() |> String.to_integer()
      after
        10_000 -> raise "the server's watchdog did not start"
      end

    url = "http://127.0.0.1:#{port}"
    server = %__MODULE__{url: url, api_key: key, dir: dir, log: log, port: p, os_pid: os_pid}

    if wait_healthy(server, System.monotonic_time(:millisecond) + 60_000) do
      server
    else
      System.cmd("kill", ["-KILL", "#{os_pid}"], stderr_to_stdout: true)
      close_port(p)
      text = File.read(log) |> elem(1)

      if is_binary(text) and String.contains?(text, "unknown field"),
        do: try_start(bin, dir, key, extra, rest, text),
        else: try_start(bin, dir, key, extra, [], to_string(text))
    end
  end

  defp wait_healthy(s, deadline) do
    ok =
      case :httpc.request(:get, {~c"#{s.url}/healthz", []}, [timeout: 2000], []) do
        {:ok, {{_, 200, _}, _, _}} -> true
        _ -> false
      end

    cond do
      ok -> true
      not alive?(s.os_pid) -> false
      System.monotonic_time(:millisecond) > deadline -> false
      true -> Process.sleep(50) && wait_healthy(s, deadline)
    end
  end

  def alive?(os_pid) do
    {_, code} = System.cmd("kill", ["-0", "#{os_pid}"], stderr_to_stdout: true)
    code == 0
  end

  @doc "The connection options of the server's operator key."
  def opts(s), do: [server: s.url, api_key: s.api_key]

  @doc "Destroys what is left, stops the server, removes its data. Answers the ids left."
  def stop(s) do
    left =
      case Cella.Sandbox.list([state: "all", limit: 1000] ++ opts(s)) do
        {:ok, sbs} -> for sb <- sbs, sb.state != "destroyed", do: sb
        _ -> []
      end

    Enum.each(left, &Cella.Sandbox.kill/1)
    # Closing the port ends the watchdog's `read`: it sends the server SIGTERM and reaps it.
    close_port(s.port)
    wait_dead(s.os_pid, 300)

    if System.get_env("CELLA_KEEP_TEST_DATA"),
      do: IO.puts(:stderr, "server data kept in #{s.dir}"),
      else: File.rm_rf(s.dir)

    Enum.map(left, & &1.id)
  end

  defp wait_dead(pid, 0), do: System.cmd("kill", ["-KILL", "#{pid}"], stderr_to_stdout: true)

  defp wait_dead(pid, n) do
    if alive?(pid), do: Process.sleep(100) && wait_dead(pid, n - 1)
  end

  defp close_port(p) do
    Port.close(p)
  rescue
    ArgumentError -> :ok
  end

  def free_port do
    {:ok, sock} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
    {:ok, port} = :inet.port(sock)
    :gen_tcp.close(sock)
    port
  end

  defp rand(n), do: :crypto.strong_rand_bytes(n) |> Base.encode16(case: :lower)

  @doc "The server's log (for failure messages)."
  def tail(s), do: File.read(s.log) |> elem(1) |> to_string() |> String.slice(-3000, 3000)
end
