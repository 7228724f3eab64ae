defmodule CellaTest.RuntimeTest do
  # Isolation runtimes: a create names one, the sandbox says which it runs on, an unknown one
  # is a 400 naming the field, templates list theirs; snapshots with memory on gVisor.
  use CellaTest.Case

  alias Cella.{Sandbox, Commands, Snapshot, Template}

  # why the gVisor-only tests are skipped (nil: they run)
  @no_runsc if System.find_executable("runsc"),
              do: nil,
              else: "runsc (gVisor) is not installed: no gvisor sandboxes here"
  if @no_runsc, do: IO.puts("runtime_test: skipping the snapshot with memory: #{@no_runsc}")

  test "a namespace sandbox says so" do
    sb = sandbox!(runtime: "namespace")
    assert sb.runtime == "namespace"
    # this server does not send `memory`: absent is nil
    assert sb.memory == nil
    assert {:ok, %Sandbox{runtime: "namespace"}} = Sandbox.get(sb.id)
  end

  test "a gvisor sandbox runs on gVisor's kernel" do
    sb = sandbox!(runtime: "gvisor")
    assert sb.runtime == "gvisor"
    assert {:ok, %Sandbox{runtime: "gvisor"}} = Sandbox.get(sb.id)
    inside = Commands.run!(sb, "cat /proc/version; dmesg 2>/dev/null | head -3").stdout
    host = File.read!("/proc/version") |> String.trim()
    assert hd(String.split(inside, "\n")) != host
    assert String.contains?(inside, "gVisor") or String.contains?(inside, "4.4.0"), inside
    assert {:ok, %Sandbox{state: "destroyed"}} = Sandbox.kill(sb)
  end

  test "memory while paused: in_ram on namespace, on_disk on gvisor, none once resumed" do
    for {runtime, want} <- [{"namespace", "in_ram"}, {"gvisor", "on_disk"}] do
      sb = sandbox!(runtime: runtime)
      assert {:ok, %Sandbox{state: "paused", memory: ^want}} = Sandbox.pause(sb)
      assert {:ok, %Sandbox{state: "running", memory: nil}} = Sandbox.resume(sb)

      assert Commands.run!(sb, "echo ok").stdout == "ok\n"
    end
  end

  test "an unknown runtime is a 400 naming the field" do
    assert {:error, %Cella.Error{reason: :invalid_request, status: 400} = e} =
             Sandbox.create(size: size(), runtime: "vm")

    assert e.details["field"] == "runtime"
    assert e.message =~ "vm"
  end

  test "a one-shot run on gvisor runs on gVisor's kernel; an unknown runtime is a 400" do
    assert {:ok, %Cella.RunResult{exit_code: 0} = r} =
             Sandbox.run("echo hi > out.txt; cat /proc/version; dmesg 2>/dev/null | head -3",
               runtime: "gvisor",
               size: size(),
               artifacts: ["out.txt"],
               timeout: 120
             )

    host = File.read!("/proc/version") |> String.trim()
    assert hd(String.split(r.stdout, "\n")) != host
    assert String.contains?(r.stdout, "gVisor") or String.contains?(r.stdout, "4.4.0"), r.stdout
    assert [%Cella.Artifact{} = art] = r.artifacts
    assert {:ok, "hi\n"} = Cella.Artifact.download(art)
    assert {:ok, %Sandbox{runtime: "gvisor", state: "destroyed"}} = Sandbox.get(r.sandbox_id)

    assert {:error, %Cella.Error{reason: :invalid_request, status: 400} = e} =
             Sandbox.run("true", runtime: "vm", size: size())

    assert Cella.Error.field(e) == "runtime"
    assert e.message =~ "vm"
  end

  test "templates list their runtimes, the default first" do
    assert {:ok, %Template{runtimes: ["namespace" | _]}} = Template.get("base")
    assert {:ok, all} = Template.list()
    assert "gvisor" in Enum.find(all, &(&1.id == "base")).runtimes
  end

  if @no_runsc, do: @tag(skip: @no_runsc)

  test "a snapshot with memory: a sandbox made from it continues where the source was" do
    sb = sandbox!(runtime: "gvisor")
    assert {:ok, %Cella.Execution{ok: true}} = Sandbox.run_code(sb, "counter = 41")
    assert {:ok, %Snapshot{memory: true} = snap} = Sandbox.create_snapshot(sb, memory: true)
    ExUnit.Callbacks.on_exit(fn -> Snapshot.delete(snap.id) end)
    assert snap.sandbox_id == sb.id
    assert {:ok, %Snapshot{memory: true}} = Snapshot.get(snap.id)
    # the source goes on; the snapshot does not
    assert {:ok, %Cella.Execution{ok: true}} = Sandbox.run_code(sb, "counter = 0")

    from = sandbox!(snapshot_id: snap.id)
    assert from.id != sb.id and from.runtime == "gvisor"
    assert {:ok, %Cella.Execution{result: "42"}} = Sandbox.run_code(from, "counter + 1")
    assert {:ok, %Cella.Execution{result: "0"}} = Sandbox.run_code(sb, "counter")

    assert {:ok, %Sandbox{state: "destroyed"}} = Sandbox.kill(from)
    assert {:ok, %Snapshot{id: id}} = Snapshot.delete(snap.id)
    assert id == snap.id

    # a fork of a gvisor sandbox carries its memory too, as it is now
    assert {:ok, [fork]} = Sandbox.fork(sb)
    ExUnit.Callbacks.on_exit(fn -> Sandbox.kill(fork) end)
    assert fork.runtime == "gvisor"
    assert {:ok, %Cella.Execution{result: "2"}} = Sandbox.run_code(fork, "counter + 2")
  end

  test "a snapshot with memory of a namespace sandbox is a 400 naming the field" do
    sb = sandbox!(runtime: "namespace")

    assert {:error, %Cella.Error{reason: :invalid_request, status: 400} = e} =
             Sandbox.create_snapshot(sb, memory: true)

    assert Cella.Error.field(e) == "memory"
    assert e.message =~ "namespace"
    assert {:ok, snaps} = Snapshot.list()
    refute Enum.any?(snaps, &(&1.sandbox_id == sb.id))
    assert {:ok, %Sandbox{state: "running"}} = Sandbox.refresh(sb)
  end
end
