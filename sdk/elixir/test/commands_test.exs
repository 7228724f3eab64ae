defmodule CellaTest.CommandsTest do
  use CellaTest.Case

  alias Cella.{Commands, CommandResult, OutputChunk, ProcessInfo}

  setup_all do
    sb = Cella.Sandbox.create!(size: size(), timeout: 1800)
    on_exit(fn -> Cella.Sandbox.kill(sb) end)
    %{sb: sb}
  end

  test "exec: output, exit code, env, cwd, stdin, argv", %{sb: sb} do
    assert {:ok, %CommandResult{exit_code: 3, stdout: "out\n", stderr: "err\n"}} =
             Commands.run(sb, "echo out; echo err >&2; exit 3")

    assert {:ok, %CommandResult{stdout: "v /tmp\n"}} =
             Commands.run(sb, "echo $X $(pwd)", env: %{"X" => "v"}, cwd: "/tmp")

    assert Commands.run!(sb, "cat", stdin: "piped").stdout == "piped"
    assert Commands.run!(sb, ["printf", "%s-%s", "a b", "c"]).stdout == "a b-c"
    assert Commands.run!(sb, "id -un", user: "root").stdout == "root\n"
  end

  test "check: true turns an exit code into an error", %{sb: sb} do
    assert {:error, %Cella.Error{reason: :command_exit, details: %{"exit_code" => 2}} = e} =
             Commands.run(sb, "echo broken >&2; exit 2", check: true)

    assert Exception.message(e) =~ "broken"
    assert_raise Cella.Error, fn -> Commands.run!(sb, "exit 1", check: true) end
  end

  test "a streamed command: output pieces arrive while it runs, then its exit", %{sb: sb} do
    {:ok, stream} =
      Commands.stream(sb, "for i in 1 2 3; do echo line$i; sleep 0.5; done; echo bye >&2; exit 4")

    {items, stamps} =
      stream
      |> Enum.map(fn item -> {item, System.monotonic_time(:millisecond)} end)
      |> Enum.unzip()

    out = for %OutputChunk{stream: :stdout, data: d} <- items, into: "", do: d
    err = for %OutputChunk{stream: :stderr, data: d} <- items, into: "", do: d
    assert out == "line1\nline2\nline3\n" and err == "bye\n"
    assert %CommandResult{exit_code: 4, timed_out: false} = List.last(items)
    # the first line was read before the command ended (streamed, not buffered)
    assert List.first(stamps) < List.last(stamps)

    me = self()
    {:ok, r} = Commands.run(sb, "echo a; sleep 0.2; echo b", on_stdout: &send(me, {:out, &1}))
    assert r.stdout == "a\nb\n" and r.exit_code == 0
    assert_received {:out, "a\n"}
  end

  test "binary output comes as bytes", %{sb: sb} do
    {:ok, stream} = Commands.stream(sb, "printf '\\377\\000'")
    assert [%OutputChunk{data: <<255, 0>>}, %CommandResult{exit_code: 0}] = Enum.to_list(stream)
  end

  test "leaving a stream early stops it; a stream is read by its own process", %{sb: sb} do
    {:ok, stream} = Commands.stream(sb, "while true; do echo tick; sleep 0.1; done")
    assert [%OutputChunk{} | _] = Enum.take(stream, 2)

    {:ok, stream} = Commands.stream(sb, "echo once")
    task = Task.async(fn -> catch_error(Enum.to_list(stream)) end)
    assert %ArgumentError{} = Task.await(task)
    Cella.EventStream.close(stream)
  end

  test "signals by name and number", %{sb: sb} do
    {:ok, p} = Commands.start(sb, "sleep 600")
    assert {:ok, %ProcessInfo{pid: pid}} = Commands.signal(sb, p.pid, "SIGTERM")
    assert pid == p.pid
    assert {:ok, %CommandResult{exit_code: 143}} = Commands.wait(sb, p.pid, timeout: 60)
    {:ok, p} = Commands.start(sb, "sleep 600")
    assert {:ok, _} = Commands.signal(sb, p.pid, 9)
    assert {:ok, %CommandResult{exit_code: 137}} = Commands.wait(sb, p.pid, timeout: 60)
    assert {:error, %Cella.Error{reason: :invalid_request}} = Commands.signal(sb, p.pid, "NOPE")
  end

  test "background processes: start, list, stdin, output, wait, kill", %{sb: sb} do
    {:ok, %ProcessInfo{pid: pid, state: "running", tag: "cat"}} =
      Commands.start(sb, "cat", tag: "cat")

    assert {:ok, procs} = Commands.list(sb)
    assert Enum.any?(procs, &(&1.pid == pid))
    {:ok, _} = Commands.send_stdin(sb, pid, "to cat\n")
    {:ok, _} = Commands.close_stdin(sb, pid)

    assert {:ok, %CommandResult{exit_code: 0, stdout: "to cat\n"}} =
             Commands.wait(sb, pid, timeout: 60)

    assert {:ok, %ProcessInfo{state: "exited", exit_code: 0}} = Commands.get(sb, pid)

    {:ok, p} = Commands.start(sb, "echo started; sleep 600")
    {:ok, stream} = Commands.output(sb, p.pid)
    assert [%OutputChunk{data: "started\n"}] = Enum.take(stream, 1)
    assert {:ok, true} = Commands.kill(sb, p.pid)
    assert {:ok, %CommandResult{exit_code: 137}} = Commands.wait(sb, p.pid, timeout: 60)
    assert {:ok, false} = Commands.kill(sb, p.pid)
    assert {:error, %Cella.Error{reason: :not_found}} = Commands.get(sb, 999_999)
  end
end
