# One real Cella server for the whole suite (see test/support/server.ex), with task runs set
# up: a `git` forge over a temporary directory of bare repositories, and a command agent
# that adds a file and commits. The SDK finds the server through CELLA_SERVER and
# CELLA_API_KEY, as a user's program would.
Code.require_file("support/server.ex", __DIR__)
Code.require_file("support/case.ex", __DIR__)
{:ok, _} = Application.ensure_all_started(:inets)

repos = Path.join(System.tmp_dir!(), "cella-elixir-repos-#{System.unique_integer([:positive])}")
File.mkdir_p!(repos)

git_id = "git -c user.name=agent -c user.email=agent@example.org"

agent_script =
  "echo agent says hello; sleep 2; echo \"made by the elixir test: $CELLA_TASK\" > ELIXIR.md && #{git_id} add -A && #{git_id} commit -qm 'Add ELIXIR.md'"

tasks_config = """

[tasks]
runners = 2
heartbeat_interval_sec = 1
grace_sec = 2

[[forges]]
name = "git"
kind = "git"
url_template = "#{repos}/{repository}.git"

[[agents]]
name = "script"
kind = "command"
command = ["bash", "-c", '''#{agent_script}''']
"""

server = CellaTest.Server.start(tasks_config)
System.put_env("CELLA_SERVER", server.url)
System.put_env("CELLA_API_KEY", server.api_key)
:persistent_term.put(:cella_test_server, server)
:persistent_term.put(:cella_test_repos, repos)

# A run stopped with SIGTERM (a CI timeout) still destroys its sandboxes and its server.
System.trap_signal(:sigterm, fn ->
  CellaTest.Server.stop(server)
  File.rm_rf(repos)
  System.halt(143)
end)

ExUnit.after_suite(fn _ ->
  left = CellaTest.Server.stop(server)
  File.rm_rf(repos)

  if left != [] do
    IO.puts(:stderr, "the tests left sandboxes behind: #{inspect(left)}")
    System.halt(1)
  end
end)

ExUnit.start(timeout: 600_000, capture_log: true)
