defmodule CellaTest.SandboxTest do
  use CellaTest.Case

  alias Cella.{Sandbox, Commands, Files, Snapshot}

  test "create, get, list by metadata, connect, kill" do
    t = tag()
    sb = sandbox!(metadata: %{"suite" => "elixir", "tag" => t})
    assert sb.state == "running" and String.starts_with?(sb.id, "sb")
    assert sb.metadata == %{"suite" => "elixir", "tag" => t}
    assert %DateTime{} = sb.created_at

    assert {:ok, got} = Sandbox.get(sb.id)
    assert got.id == sb.id and got.size == "xs"

    assert {:ok, [listed]} = Sandbox.list(metadata: %{"tag" => t})
    assert listed.id == sb.id

    assert {:ok, same} = Sandbox.connect(sb.id)
    assert same.id == sb.id and same.state == "running"

    assert {:ok, gone} = Sandbox.kill(sb)
    assert gone.state == "destroyed"
    assert {:ok, []} = Sandbox.list(metadata: %{"tag" => t})
  end

  test "preview and auto_resume at create; kill by id, without a resume" do
    sb = sandbox!(preview: %{public: false}, auto_resume: true)
    assert sb.preview == %{"public" => false}
    assert sb.auto_resume == true
    assert sb.resource_contract["contract_id"] == "sandbox/xs@v1"
    assert {:ok, %Sandbox{state: "paused"}} = Sandbox.pause(sb)

    assert {:ok, %Sandbox{id: id, state: "destroyed", auto_resume: true} = gone} =
             Sandbox.kill(sb.id)

    assert id == sb.id and is_integer(gone.total_runtime_sec)
    assert {:ok, %Sandbox{state: "destroyed"}} = Sandbox.kill(sb.id)
    assert {:error, %Cella.Error{reason: :not_found}} = Sandbox.kill("sbnosuchsandbox000000")
    assert_raise Cella.Error, fn -> Sandbox.kill!("sbnosuchsandbox000000", []) end

    other = sandbox!()
    assert other.preview == %{"public" => true} and other.auto_resume == false
    assert {:ok, %Sandbox{state: "destroyed"}} = Sandbox.kill(other.id, [])
  end

  test "a size by its resources: cpu_count, memory_mb, disk_size_mb of one contract" do
    assert {:ok, sb} =
             Sandbox.create(cpu_count: 1, memory_mb: 1024, disk_size_mb: 4096, timeout: 300)

    on_exit(fn -> Sandbox.kill(sb) end)
    assert sb.size == "xs" and sb.cpu_count == 1

    assert {:error, %Cella.Error{reason: :invalid_request} = e} =
             Sandbox.create(cpu_count: 3, memory_mb: 1024, disk_size_mb: 4096)

    assert Cella.Error.field(e) == "cpu_count"
    assert is_list(e.details["contracts"])
  end

  test "templates say the names the SDKs and the CLI know them by" do
    assert {:ok, %Cella.Template{sdk_name: "base", cli_name: "base", product: "sandbox"}} =
             Cella.Template.get("base")
  end

  test "with_sandbox destroys its sandbox after, also when the function raises" do
    me = self()

    assert {:ok, "in\n"} =
             Sandbox.with_sandbox([size: size()], fn sb ->
               send(me, {:id, sb.id})
               Commands.run!(sb, "echo in").stdout
             end)

    assert_received {:id, id}
    assert {:ok, %Sandbox{state: "destroyed"}} = Sandbox.get(id)

    assert_raise RuntimeError, fn ->
      Sandbox.with_sandbox([size: size()], fn sb ->
        send(me, {:id, sb.id})
        raise "boom"
      end)
    end

    assert_received {:id, id2}
    assert {:ok, %Sandbox{state: "destroyed"}} = Sandbox.get(id2)
  end

  test "pause, resume, timeout and usage" do
    sb = sandbox!()
    assert {:ok, %Sandbox{state: "paused"} = paused} = Sandbox.pause(sb)
    assert {:error, %Cella.Error{reason: :sandbox_not_running}} = Commands.run(paused, "true")
    # connect resumes a paused sandbox
    assert {:ok, %Sandbox{state: "running"}} = Sandbox.connect(sb.id)
    assert {:ok, %Sandbox{timeout_sec: 900}} = Sandbox.set_timeout(sb, 900)
    assert {:ok, %Cella.SandboxUsage{sandbox_id: id} = u} = Sandbox.usage(sb)
    assert id == sb.id and is_number(u.running_sec)
  end

  test "a persistent sandbox: stopped with its files kept, resumed" do
    sb = sandbox!(persistent: true)
    assert sb.persistent
    Files.write!(sb, "/home/user/kept.txt", "kept")
    assert {:ok, %Sandbox{state: "stopped"}} = Sandbox.stop(sb)
    assert {:ok, %Sandbox{state: "running"}} = Sandbox.resume(sb)
    assert Files.read!(sb, "/home/user/kept.txt") == "kept"
  end

  test "create without waiting, then wait_ready" do
    sb = sandbox!(wait: false)
    assert {:ok, %Sandbox{state: "running"}} = Sandbox.wait_ready(sb, 120)
  end

  test "snapshot, a sandbox made from it, fork" do
    sb = sandbox!()
    Files.write!(sb, "/home/user/state.txt", "from the source")

    assert {:ok, %Snapshot{id: "snap" <> _} = snap} = Sandbox.create_snapshot(sb)
    assert snap.sandbox_id == sb.id and snap.memory == false
    assert {:ok, %Snapshot{id: id}} = Snapshot.get(snap.id)
    assert id == snap.id
    assert {:ok, snaps} = Snapshot.list()
    assert Enum.any?(snaps, &(&1.id == snap.id))

    from = sandbox!(snapshot_id: snap.id)
    assert Files.read!(from, "/home/user/state.txt") == "from the source"

    assert {:ok, [fork]} = Sandbox.fork(sb, count: 1, metadata: %{"fork" => "yes"})
    ExUnit.Callbacks.on_exit(fn -> Sandbox.kill(fork) end)
    assert fork.id != sb.id and fork.metadata["fork"] == "yes"
    assert Files.read!(fork, "/home/user/state.txt") == "from the source"

    Sandbox.kill!(from)
    assert {:ok, _} = Snapshot.delete(snap.id)
    assert {:error, %Cella.Error{reason: :not_found}} = Snapshot.get(snap.id)
  end

  test "a preview: a server in the sandbox answers through its exposed URL" do
    sb = sandbox!()
    Files.write!(sb, "/home/user/site/index.html", "hello from the preview")

    {:ok, _} =
      Commands.start(sb, "cd /home/user/site && exec python3 -m http.server 8000", tag: "web")

    {:ok, info} = Sandbox.expose_info(sb, 8000)
    assert info.port == 8000 and is_binary(info.url)

    headers =
      if info.token, do: [{~c"x-cella-preview-token", String.to_charlist(info.token)}], else: []

    assert body = poll_url(info.url, headers, 100)
    assert body =~ "hello from the preview"
    assert {:ok, %Cella.PreviewToken{token: token}} = Sandbox.preview_token(sb)
    assert is_binary(token)
  end

  defp poll_url(_url, _h, 0), do: nil

  defp poll_url(url, h, n) do
    case :httpc.request(:get, {String.to_charlist(url), h}, [timeout: 5000], body_format: :binary) do
      {:ok, {{_, 200, _}, _, body}} -> body
      _ -> Process.sleep(200) && poll_url(url, h, n - 1)
    end
  end
end
