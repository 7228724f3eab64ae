defmodule CellaTest.RunsTest do
  use CellaTest.Case

  alias Cella.{Sandbox, Artifact, RunResult, Template, Workspace}

  test "a one-shot run writes files, runs, keeps artifacts; they download after" do
    assert {:ok, %RunResult{exit_code: 0} = r} =
             Sandbox.run("python3 make.py",
               files: %{
                 "make.py" =>
                   "open('out.txt', 'w').write('made ' + open('in.bin', 'rb').read().hex())",
                 "in.bin" => <<0xFF, 1>>
               },
               artifacts: ["out.txt"],
               size: size(),
               timeout: 120
             )

    assert [%Artifact{path: path} = art] = r.artifacts
    assert path =~ "out.txt"
    assert {:ok, "made ff01"} = Artifact.download(art)
    {:ok, stream} = Artifact.download_stream(art.id)
    assert Enum.join(stream) == "made ff01"
    assert {:ok, arts} = Artifact.list(sandbox_id: r.sandbox_id)
    assert Enum.map(arts, & &1.id) == [art.id]
    assert {:ok, _} = Artifact.delete(art)
    assert {:error, %Cella.Error{reason: :not_found}} = Artifact.download(art)

    assert {:error, %Cella.Error{reason: :command_exit}} =
             Sandbox.run("exit 5", check: true, size: size())
  end

  test "collect artifacts from a running sandbox" do
    sb = sandbox!()
    Cella.Files.write!(sb, "/home/user/report.txt", "report")
    assert {:ok, [%Artifact{} = a]} = Sandbox.collect_artifacts(sb, ["report.txt"])
    assert Artifact.download!(a) == "report"
  end

  test "templates: the catalog, and a custom template built, used and deleted" do
    assert {:ok, templates} = Template.list()
    assert %Template{id: "base"} = Enum.find(templates, &(&1.id == "base"))
    assert {:ok, %Template{id: "base", sizes: [_ | _]}} = Template.get("base")

    id = "elixir-" <> tag()

    {:ok, build} =
      Template.build(%{id: id, from: "base", steps: [%{run: "echo built > /opt/elixir-marker"}]})

    assert {:ok, %Cella.TemplateBuild{state: "ready"} = done} =
             Template.wait_build(build, check: true, timeout: 600)

    assert done.log != ""
    assert {:ok, [_ | _]} = Template.builds(id)
    sb = sandbox!(template: id)
    assert Cella.Commands.run!(sb, "cat /opt/elixir-marker").stdout == "built\n"
    Sandbox.kill!(sb)
    assert {:ok, _} = Template.delete(id)
  end

  test "the wallet, a credit, the ledger and usage" do
    ws = workspace_id()
    {:ok, before} = Workspace.wallet(ws)
    assert is_binary(before.balance) and before.currency == "USD"

    assert {:ok, %Cella.LedgerEntry{kind: "credit", amount: "1.500000"}} =
             Workspace.credit(ws, "1.5", reference: "elixir test")

    {:ok, ledger} = Workspace.ledger(ws, limit: 10)
    assert Enum.any?(ledger, &(&1.reference == "elixir test"))

    assert {:ok, %Cella.WorkspaceUsage{currency: "USD"}} =
             Workspace.usage(ws, from: Date.add(Date.utc_today(), -7))

    assert {:ok, %Cella.Storage{}} = Workspace.storage(ws)
    assert {:ok, %Workspace{id: ^ws}} = Workspace.get(ws)
  end
end
