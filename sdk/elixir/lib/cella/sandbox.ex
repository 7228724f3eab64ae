defmodule Cella.Sandbox do
  @moduledoc """
  A sandbox on a Cella server: the object the server answers (id, state, template, size,
  timers, metadata...) and the connection it was reached with (`config`), so that every call
  on it goes to the same server with the same key.

      {:ok, sb} = Cella.Sandbox.create(template: "base", size: "xs", timeout: 600)
      {:ok, sb} = Cella.Sandbox.pause(sb)
      {:ok, sb} = Cella.Sandbox.resume(sb)
      {:ok, _} = Cella.Sandbox.kill(sb)

  Calls that change the sandbox answer it as it is afterwards. `Cella.Commands`,
  `Cella.Files` and `Cella.Code` take a sandbox as their first argument.
  """

  import Cella, only: [defbang: 1]
  alias Cella.{HTTP, Config, Error}

  use Cella.Model, [
    :id,
    :state,
    :template_id,
    :size,
    :cpu_count,
    :memory_mb,
    :disk_size_mb,
    :ready,
    :timeout_sec,
    :timeout_remaining_ms,
    :always_on,
    :persistent,
    :idle_timeout_sec,
    :created_at,
    :started_at,
    :ready_at,
    :destroyed_at,
    :total_runtime_sec,
    :tenant_id,
    :owner_id,
    :preview_url,
    :state_reason,
    :network,
    :compute_rate,
    :compute_cost,
    :model_cost,
    # preview traffic resumes it when it is paused
    :auto_resume,
    # the isolation runtime it runs on: "namespace" or "gvisor"
    :runtime,
    # where a paused sandbox's memory is ("in_ram" or "on_disk"); nil when the server does not say
    :memory,
    metadata: %{},
    resource_contract: %{},
    # who may use its previews: %{"public" => false} needs its preview token
    preview: %{},
    config: nil
  ]

  @type t :: %__MODULE__{}

  def cast(s),
    do: %{s | network: Cella.NetworkPolicy.from_map(s.network), metadata: s.metadata || %{}}

  @doc false
  def wrap(data, %Config{} = config), do: %{from_map(data) | config: config}

  defp update(%__MODULE__{config: c}, {:ok, data}), do: {:ok, wrap(data, c)}
  defp update(_, {:error, _} = e), do: e

  # ------------------------------------------------------------------ making and finding

  @doc """
  Creates a sandbox and (unless `wait: false`) waits until it runs.

  Options: `:template` (default the server's `base`), `:size` (default the template's; or
  `:cpu_count`, `:memory_mb` and `:disk_size_mb` together, equal to one size's contract),
  `:timeout` (the active-session timeout in seconds, default 3600), `:metadata` and `:env`
  (maps of strings), `:network` (`%{egress: "deny", allow: ["packages.example.org"]}`), `:idle_timeout`,
  `:persistent`, `:always_on`, `:snapshot_id` (start from a snapshot), `:runtime` (the isolation
  runtime, `"namespace"` or `"gvisor"`; default the template's, then the server's; gVisor needs
  `runsc` on the server), `:preview` (`%{public: false}`: previews need the sandbox's preview
  token), `:auto_resume` (preview traffic resumes it when paused), `:model_access` (it may use
  the model gateway), `:wait`, `:extra` (raw fields added to the body), and the connection's
  (`Cella.Config`).
  """
  @spec create(keyword) :: {:ok, t} | {:error, Error.t()}
  def create(opts \\ []) do
    {c, o} = Cella.split_opts(opts)

    body =
      %{
        snapshot_id: o[:snapshot_id],
        runtime: o[:runtime],
        template_id: o[:template],
        size: o[:size],
        cpu_count: o[:cpu_count],
        memory_mb: o[:memory_mb],
        disk_size_mb: o[:disk_size_mb],
        timeout_sec: Cella.seconds(o[:timeout]),
        idle_timeout_sec: Cella.seconds(o[:idle_timeout]),
        persistent: o[:persistent],
        always_on: o[:always_on],
        metadata: o[:metadata],
        env: o[:env],
        network: o[:network],
        preview: o[:preview],
        auto_resume: o[:auto_resume],
        model_access: o[:model_access],
        wait: if(Keyword.get(o, :wait, true), do: nil, else: false)
      }
      |> Enum.reject(fn {_, v} -> is_nil(v) end)
      |> Map.new()
      |> Map.merge(Map.new(o[:extra] || %{}))

    with {:ok, data} <-
           HTTP.data(c, :post, "/sandboxes", json: body, timeout: c.request_timeout + 120) do
      {:ok, wrap(data, c)}
    end
  end

  @doc """
  Creates a sandbox (with `create/1`'s options), calls `fun` with it, and destroys it after,
  also when `fun` raises: `{:ok, what fun answered}`, or the error of the create.

      {:ok, out} = Cella.Sandbox.with_sandbox([size: "xs"], fn sb ->
        Cella.Commands.run!(sb, "uname -a").stdout
      end)
  """
  @spec with_sandbox(keyword, (t -> result)) :: {:ok, result} | {:error, Error.t()} when result: var
  def with_sandbox(opts \\ [], fun) when is_function(fun, 1) do
    with {:ok, sb} <- create(opts) do
      try do
        {:ok, fun.(sb)}
      after
        kill(sb)
      end
    end
  end

  @doc """
  Attaches to an existing sandbox. A `paused` or `stopped` one is resumed first, unless
  `resume: false`.
  """
  @spec connect(String.t(), keyword) :: {:ok, t} | {:error, Error.t()}
  def connect(id, opts \\ []) do
    {resume?, opts} = Keyword.pop(opts, :resume, true)

    with {:ok, sb} <- get(id, opts) do
      if resume? and sb.state in ["paused", "stopped"], do: resume(sb), else: {:ok, sb}
    end
  end

  @doc "One sandbox, by id."
  @spec get(String.t(), keyword) :: {:ok, t} | {:error, Error.t()}
  def get(id, opts \\ []) do
    {c, _} = Cella.split_opts(opts)
    with {:ok, data} <- HTTP.data(c, :get, HTTP.sandbox_path(id)), do: {:ok, wrap(data, c)}
  end

  @doc """
  The workspace's live sandboxes (not destroyed or failed), newest first. Options: `:state`
  (one state, or `"all"`), `:metadata` (keeps those whose metadata has every entry given),
  `:limit` (default: every page).
  """
  @spec list(keyword) :: {:ok, [t]} | {:error, Error.t()}
  def list(opts \\ []) do
    {c, o} = Cella.split_opts(opts)
    params = [state: o[:state]] ++ for({k, v} <- o[:metadata] || %{}, do: {"metadata.#{k}", v})

    with {:ok, items} <- Cella.pages(c, "/sandboxes", params, o[:limit], __MODULE__) do
      {:ok, Enum.map(items, &%{&1 | config: c})}
    end
  end

  @doc "Reads the sandbox again from the server."
  @spec refresh(t) :: {:ok, t} | {:error, Error.t()}
  def refresh(%__MODULE__{} = sb), do: update(sb, HTTP.data(sb.config, :get, path(sb)))

  @doc "Polls until the sandbox runs and is ready (after `create(wait: false)`). `timeout` in seconds."
  @spec wait_ready(t, number) :: {:ok, t} | {:error, Error.t()}
  def wait_ready(%__MODULE__{} = sb, timeout \\ 60) do
    deadline = System.monotonic_time(:millisecond) + round(timeout * 1000)
    poll_ready(sb, deadline, timeout)
  end

  defp poll_ready(sb, deadline, timeout) do
    with {:ok, sb} <- refresh(sb) do
      cond do
        sb.state == "running" and sb.ready != false ->
          {:ok, sb}

        sb.state in ["error", "destroyed", "stopped"] ->
          {:error,
           Error.new("UNAVAILABLE", "sandbox #{sb.id} is #{sb.state}: #{sb.state_reason}",
             details: %{"sandbox_id" => sb.id, "state" => sb.state}
           )}

        System.monotonic_time(:millisecond) >= deadline ->
          {:error, Error.new("TIMEOUT", "sandbox #{sb.id} was not running after #{timeout} s")}

        true ->
          Process.sleep(100)
          poll_ready(sb, deadline, timeout)
      end
    end
  end

  # ------------------------------------------------------------------ lifecycle

  @doc "Freezes every process (memory kept). Only from `running`."
  def pause(%__MODULE__{} = sb), do: update(sb, HTTP.data(sb.config, :post, path(sb, "pause")))

  @doc "Thaws a paused sandbox, or boots a stopped one again on its kept files."
  def resume(%__MODULE__{} = sb),
    do:
      update(
        sb,
        HTTP.data(sb.config, :post, path(sb, "resume"), timeout: sb.config.request_timeout + 120)
      )

  @doc "Ends every process and keeps the files (persistent sandboxes only)."
  def stop(%__MODULE__{} = sb), do: update(sb, HTTP.data(sb.config, :post, path(sb, "stop")))

  @doc """
  Destroys the sandbox (idempotent); its files are gone. Also takes a sandbox's id (and the
  connection's options): it is destroyed without being attached or resumed first.
  """
  @spec kill(t | String.t(), keyword) :: {:ok, t} | {:error, Error.t()}
  def kill(sb_or_id, opts \\ [])
  def kill(%__MODULE__{} = sb, _opts), do: update(sb, HTTP.data(sb.config, :delete, path(sb)))

  def kill(id, opts) when is_binary(id) do
    {c, _} = Cella.split_opts(opts)
    with {:ok, data} <- HTTP.data(c, :delete, HTTP.sandbox_path(id)), do: {:ok, wrap(data, c)}
  end

  @doc "The same as `kill/1`."
  def destroy(%__MODULE__{} = sb), do: kill(sb)

  @doc "Sets the active-session timeout, in seconds; on a running sandbox the timer restarts."
  def set_timeout(%__MODULE__{} = sb, seconds) do
    update(
      sb,
      HTTP.data(sb.config, :post, path(sb, "timeout"), json: %{timeout_sec: Cella.seconds(seconds)})
    )
  end

  @doc "Running, paused and billed seconds, CPU seconds and memory MiB-seconds."
  @spec usage(t) :: {:ok, Cella.SandboxUsage.t()} | {:error, Error.t()}
  def usage(%__MODULE__{} = sb) do
    with {:ok, d} <- HTTP.data(sb.config, :get, path(sb, "usage")),
         do: {:ok, Cella.SandboxUsage.from_map(d)}
  end

  # ------------------------------------------------------------------ snapshots, forks, artifacts

  @doc """
  Copies the sandbox's files into a snapshot, from which `create(snapshot_id: id)` starts new
  sandboxes. A running sandbox is frozen only while the copy is taken.

  `memory: true` (gVisor sandboxes) keeps its memory and processes too: sandboxes made from
  the snapshot continue where it was (the snapshot's `memory` is `true`). On a namespace
  sandbox it is an `:invalid_request` error naming `memory`, and nothing is made.
  """
  @spec create_snapshot(t, keyword) :: {:ok, Cella.Snapshot.t()} | {:error, Error.t()}
  def create_snapshot(%__MODULE__{} = sb, opts \\ []) do
    body = if Keyword.has_key?(opts, :memory), do: [json: %{memory: opts[:memory]}], else: []

    with {:ok, d} <-
           HTTP.data(
             sb.config,
             :post,
             path(sb, "snapshots"),
             body ++ [timeout: sb.config.request_timeout + 300]
           ) do
      {:ok, Cella.Snapshot.from_map(d)}
    end
  end

  @doc "Copies of this sandbox (`count`, 1-10; `metadata`), each a new running sandbox."
  @spec fork(t, keyword) :: {:ok, [t]} | {:error, Error.t()}
  def fork(%__MODULE__{} = sb, opts \\ []) do
    body = %{count: Keyword.get(opts, :count, 1)}
    body = if opts[:metadata], do: Map.put(body, :metadata, opts[:metadata]), else: body

    with {:ok, d} <-
           HTTP.data(sb.config, :post, path(sb, "fork"),
             json: body,
             timeout: sb.config.request_timeout + 300
           ) do
      {:ok, Enum.map(List.wrap(d), &wrap(&1, sb.config))}
    end
  end

  @doc """
  Keeps files of the running sandbox as artifacts (paths or globs, relative to `/home/user`
  or absolute); they outlive the sandbox until they expire.
  """
  @spec collect_artifacts(t, [String.t()]) :: {:ok, [Cella.Artifact.t()]} | {:error, Error.t()}
  def collect_artifacts(%__MODULE__{} = sb, paths) do
    with {:ok, d} <- HTTP.data(sb.config, :post, path(sb, "artifacts"), json: %{paths: paths}) do
      {:ok, Cella.Model.list(d, Cella.Artifact)}
    end
  end

  # ------------------------------------------------------------------ previews

  @doc "The URL at which a port inside the sandbox is reachable through the preview proxy."
  @spec expose(t, pos_integer) :: {:ok, String.t()} | {:error, Error.t()}
  def expose(%__MODULE__{} = sb, port) do
    with {:ok, info} <- expose_info(sb, port), do: {:ok, info.url}
  end

  @doc "Every address of a port inside the sandbox (`POST .../expose`)."
  @spec expose_info(t, pos_integer) :: {:ok, Cella.ExposedPort.t()} | {:error, Error.t()}
  def expose_info(%__MODULE__{} = sb, port) do
    with {:ok, d} <- HTTP.data(sb.config, :post, path(sb, "expose"), json: %{port: port}) do
      {:ok, Cella.ExposedPort.from_map(if is_map(d), do: d, else: %{"port" => port, "url" => d})}
    end
  end

  @doc """
  The host name (and port) of a port's own preview origin, without a scheme.
  """
  @spec get_host(t, pos_integer) :: {:ok, String.t()} | {:error, Error.t()}
  def get_host(%__MODULE__{} = sb, port) do
    with {:ok, info} <- expose_info(sb, port) do
      uri = URI.parse(info.host_url || info.url)
      {:ok, if(uri.port in [80, 443, nil], do: uri.host, else: "#{uri.host}:#{uri.port}")}
    end
  end

  @doc "A new preview token (`ttl_sec:`, `rotate: true` to end the previous ones)."
  @spec preview_token(t, keyword) :: {:ok, Cella.PreviewToken.t()} | {:error, Error.t()}
  def preview_token(%__MODULE__{} = sb, opts \\ []) do
    body = opts |> Keyword.take([:ttl_sec, :rotate]) |> Map.new()

    with {:ok, d} <- HTTP.data(sb.config, :post, path(sb, "preview-token"), json: body) do
      {:ok, Cella.PreviewToken.from_map(d)}
    end
  end

  # ------------------------------------------------------------------ one-shot runs and code

  @doc """
  A one-shot run (`POST /api/v1/sandboxes/run`): a sandbox is created, `:files` written into
  it, the command (a shell line or a list of arguments) run, the files matching the
  `:artifacts` globs kept, and the sandbox destroyed, in one request.

  `:files` maps paths (absolute, or relative to `:cwd`) to content (binaries that are not
  UTF-8 are sent as base64). Other options: `:timeout` (the command's, seconds), `:env`,
  `:cwd`, `:user`, `:stdin`, `:template`, `:size`, `:runtime` (`"namespace"` or `"gvisor"`, as
  at create), `:metadata`, `:network`, `check: true` (an exit code other than 0 is an error
  `COMMAND_EXIT`). Download the artifacts with
  `Cella.Artifact.download/2`.
  """
  @spec run(String.t() | [String.t()], keyword) :: {:ok, Cella.RunResult.t()} | {:error, Error.t()}
  def run(cmd, opts \\ []) do
    {c, o} = Cella.split_opts(opts)

    files =
      for {p, content} <- o[:files] || %{} do
        if String.valid?(content),
          do: %{path: to_string(p), content: content},
          else: %{path: to_string(p), content: Base.encode64(content), encoding: "base64"}
      end

    body =
      Cella.Commands.command_body(cmd, o)
      |> Map.merge(
        %{
          template_id: o[:template],
          size: o[:size],
          runtime: o[:runtime],
          metadata: o[:metadata],
          network: o[:network],
          files: if(files == [], do: nil, else: files),
          artifacts: o[:artifacts]
        }
        |> Enum.reject(fn {_, v} -> is_nil(v) end)
        |> Map.new()
      )

    timeout = (Cella.seconds(o[:timeout]) || 3600) + 150

    with {:ok, d} <- HTTP.data(c, :post, "/sandboxes/run", json: body, timeout: timeout) do
      r = Cella.RunResult.from_map(d)

      if o[:check] && r.exit_code != 0,
        do: {:error, Cella.Commands.exit_error(r.exit_code, r.stdout, r.stderr, r.timed_out)},
        else: {:ok, r}
    end
  end

  @doc "Runs a cell in the sandbox's code interpreter (see `Cella.Code.run/3`)."
  def run_code(%__MODULE__{} = sb, code, opts \\ []), do: Cella.Code.run(sb, code, opts)

  defp path(sb, rest \\ []), do: HTTP.sandbox_path(sb.id, rest)

  defbang(
    create: [0, 1],
    connect: [1, 2],
    get: [1, 2],
    list: [0, 1],
    refresh: 1,
    wait_ready: [1, 2],
    pause: 1,
    resume: 1,
    stop: 1,
    kill: [1, 2],
    destroy: 1,
    set_timeout: 2,
    usage: 1,
    create_snapshot: [1, 2],
    fork: [1, 2],
    collect_artifacts: 2,
    expose: 2,
    expose_info: 2,
    get_host: 2,
    preview_token: [1, 2],
    run: [1, 2],
    run_code: [2, 3]
  )
end
