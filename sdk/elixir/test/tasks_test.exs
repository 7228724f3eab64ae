defmodule CellaTest.TasksTest do
  # A task run against a local repository: a `git` forge over bare repositories in a
  # temporary directory, and a command agent that adds a file and commits (see
  # test_helper.exs). The run is followed through its events to `stopped`; its branch, with
  # the agent's commit, is then in the repository.
  use CellaTest.Case

  alias Cella.{Task, TaskEvent, Workspace}

  defp git(args, opts \\ []) do
    {out, 0} = System.cmd("git", args, [stderr_to_stdout: true] ++ opts)
    out
  end

  defp make_repo(name) do
    bare = Path.join(repos(), name <> ".git")
    File.mkdir_p!(bare)
    git(["-c", "init.defaultBranch=main", "init", "-q", "--bare", bare])
    work = Path.join(System.tmp_dir!(), "cella-elixir-work-#{tag()}")
    git(["-c", "init.defaultBranch=main", "init", "-q", work])
    File.write!(Path.join(work, "README.md"), "# web\n")
    id = ["-c", "user.name=t", "-c", "user.email=t@example.org"]
    git(id ++ ["-C", work, "add", "-A"])
    git(id ++ ["-C", work, "commit", "-qm", "First"])
    git(["-C", work, "push", "-q", bare, "HEAD:refs/heads/main"])
    File.rm_rf!(work)
    bare
  end

  setup_all do
    ws = workspace_id()
    repo = "acme/web-" <> tag()
    bare = make_repo(repo)

    # off by default: a start is refused, nothing queued
    assert {:error, %Cella.Error{status: 403, details: %{"reason" => "tasks_disabled"}}} =
             Task.start(repository: repo, task: "x")

    {:ok, %Workspace{settings: %{"tasks_enabled" => true}}} =
      Workspace.update(ws,
        settings: %{
          tasks_enabled: true,
          compute_rate: "0.001000",
          session_limit_min: 5,
          heartbeat_timeout_sec: 60
        }
      )

    {:ok, _} = Workspace.credit(ws, "20", reference: "task runs")
    %{ws: ws, repo: repo, bare: bare}
  end

  test "a task run: started, followed to stopped, its branch pushed with the agent's commit",
       %{ws: ws, repo: repo, bare: bare} do
    assert {:ok, %Task{state: "queued", id: id} = task} =
             Task.start(
               repository: repo,
               base_branch: "main",
               task: "add the file",
               metadata: %{"suite" => "elixir"}
             )

    # the live log, opened while the run is queued: the agent's output as it runs
    assert {:ok, log} = Task.log(task)
    text = log |> Enum.map(fn %Cella.LogChunk{text: t} -> t end) |> Enum.join()
    assert text =~ "agent says hello"

    assert {:ok, events} = Task.events(task, timeout: 300)
    events = Enum.to_list(events)
    states = for %TaskEvent{type: :state, state: s} <- events, do: s
    assert List.last(states) == "stopped", inspect(events)

    assert {:ok, %Task{state: "stopped", stop_reason: "agent_exit", branch: branch}} = Task.get(id)
    assert branch == "cella/" <> id
    assert git(["--git-dir", bare, "branch", "--list", branch]) =~ branch

    assert git(["--git-dir", bare, "show", branch <> ":ELIXIR.md"]) =~
             "made by the elixir test: add the file"

    assert git(["--git-dir", bare, "log", "--format=%s", branch]) =~ "Add ELIXIR.md"

    assert {:ok, tasks} = Task.list(repository: repo)
    assert Enum.map(tasks, & &1.id) == [id]
    # a run that ended: cancel leaves it as it is, and its live log is gone
    assert {:ok, %Task{state: "stopped"}} = Task.cancel(id)
    assert {:error, %Cella.Error{status: 410}} = Task.log(id)
    # it was billed
    {:ok, ledger} = Workspace.ledger(ws, limit: 20)
    assert Enum.any?(ledger, &(&1.task_id == id and &1.kind == "compute"))
  end

  test "a run cancelled ends cancelled" do
    repo = "acme/cancel-" <> tag()
    make_repo(repo)

    {:ok, task} = Task.start(repository: repo, task: "never mind")
    assert {:ok, %Task{}} = Task.cancel(task)
    assert {:ok, %Task{state: state}} = Task.wait(task, timeout: 120)
    assert state in ["cancelled", "stopped"]
  end
end
