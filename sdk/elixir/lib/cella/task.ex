defmodule Cella.Task do
  @moduledoc """
  Task runs: an agent works on a repository at a base branch in a fresh sandbox, on a new
  branch, which is handed back, pushed and (on GitHub, GitLab) opened as a draft.

      {:ok, task} = Cella.Task.start(repository: "acme/web", task: "Fix the greeting")
      {:ok, events} = Cella.Task.events(task)
      Enum.each(events, &IO.inspect/1)   # %Cella.TaskEvent{type: :state, state: "running"}, ...
      {:ok, task} = Cella.Task.get(task.id)
      task.state   #=> "stopped"

  (Not to be confused with Elixir's own `Task`.)
  """
  import Cella, only: [defbang: 1]
  alias Cella.{HTTP, Error, EventStream, TaskEvent, LogChunk}

  use Cella.Model, [
    :id,
    :workspace_id,
    :created_by,
    :repository,
    :base_branch,
    :branch,
    :forge,
    :agent,
    :state,
    :failure_reason,
    :stop_reason,
    :pull_request,
    :queued_at,
    :started_at,
    :ended_at,
    :compute_sec,
    :compute_rate,
    :compute_cost,
    :model_cost,
    :model_requests,
    :session_limit_min,
    metadata: %{},
    config: nil
  ]

  @terminal ["stopped", "failed", "cancelled"]

  @doc "True for `stopped`, `failed` and `cancelled`."
  def terminal?(%__MODULE__{state: s}), do: s in @terminal

  defp wrap({:ok, d}, c), do: {:ok, %{from_map(d) | config: c}}
  defp wrap(e, _), do: e

  @doc """
  Starts a run: `repository:` (`owner/name`), `task:` (the message), and optionally
  `base_branch:`, `forge:`, `agent:`, `metadata:`. Answers the task, `queued`.
  """
  def start(opts) do
    {c, o} = Cella.split_opts(opts)

    body =
      o
      |> Keyword.take([:repository, :task, :base_branch, :forge, :agent, :metadata])
      |> Enum.reject(fn {_, v} -> is_nil(v) end)
      |> Map.new()

    wrap(HTTP.data(c, :post, "/tasks", json: body), c)
  end

  @doc "The workspace's runs, newest first (`state:`, `repository:`, `limit:`)."
  def list(opts \\ []) do
    {c, o} = Cella.split_opts(opts)

    with {:ok, items} <-
           Cella.pages(
             c,
             "/tasks",
             [state: o[:state], repository: o[:repository]],
             o[:limit],
             __MODULE__
           ) do
      {:ok, Enum.map(items, &%{&1 | config: c})}
    end
  end

  @doc "One run (a task or its id)."
  def get(task, opts \\ [])
  def get(%__MODULE__{id: id, config: c}, opts), do: get(id, [config: c] ++ opts)

  def get(id, opts) do
    {c, _} = Cella.split_opts(opts)
    wrap(HTTP.data(c, :get, "/tasks/" <> HTTP.seg(id)), c)
  end

  @doc "Cancels a run (idempotent; a run that ended is answered as it is)."
  def cancel(task, opts \\ [])
  def cancel(%__MODULE__{id: id, config: c}, opts), do: cancel(id, [config: c] ++ opts)

  def cancel(id, opts) do
    {c, _} = Cella.split_opts(opts)
    wrap(HTTP.data(c, :post, "/tasks/" <> HTTP.seg(id) <> "/cancel"), c)
  end

  @doc """
  Follows a run's events: a stream of `%Cella.TaskEvent{}`s, the state it is in first, then
  every change and progress counts; it ends after a terminal state.
  """
  def events(task, opts \\ [])
  def events(%__MODULE__{id: id, config: c}, opts), do: events(id, [config: c] ++ opts)

  def events(id, opts) do
    {c, o} = Cella.split_opts(opts)
    deadline = o[:timeout] && System.monotonic_time(:millisecond) + round(o[:timeout] * 1000)

    EventStream.open(
      c,
      :get,
      "/tasks/" <> HTTP.seg(id) <> "/events",
      [deadline: deadline],
      nil,
      fn
        %{event: "error"} = ev, _ ->
          {:error, EventStream.error_event(ev)}

        %{event: e} = ev, acc when e in ["state", "progress"] ->
          d = EventStream.json(ev) || %{}
          item = %{TaskEvent.from_map(d) | type: String.to_atom(e)}

          if e == "state" and d["state"] in @terminal,
            do: {:halt, [item], :ended},
            else: {:cont, [item], acc}

        _, acc ->
          {:cont, [], acc}
      end,
      fn _ -> :ok end
    )
  end

  @doc """
  The agent's output while the run is alive: a stream of `%Cella.LogChunk{}`s (`stream`,
  `text`), which ends when the run ends. A run that has ended answers `GONE` (410).
  """
  def log(task, opts \\ [])
  def log(%__MODULE__{id: id, config: c}, opts), do: log(id, [config: c] ++ opts)

  def log(id, opts) do
    {c, _} = Cella.split_opts(opts)

    EventStream.open(
      c,
      :get,
      "/tasks/" <> HTTP.seg(id) <> "/log",
      [],
      nil,
      fn
        %{event: "output"} = ev, acc ->
          {:cont, [LogChunk.from_map(EventStream.json(ev) || %{})], acc}

        %{event: "error"} = ev, _ ->
          {:error, EventStream.error_event(ev)}

        _, acc ->
          {:cont, [], acc}
      end,
      fn _ -> :ok end
    )
  end

  @doc "Follows a run's events to its end and answers the run as it ended (`timeout:` seconds)."
  def wait(task, opts \\ []) do
    with {:ok, stream} <- events(task, opts) do
      try do
        Stream.run(stream)
        get(task, opts)
      rescue
        e in Error -> {:error, e}
      end
    end
  end

  defbang(
    start: 1,
    list: [0, 1],
    get: [1, 2],
    cancel: [1, 2],
    events: [1, 2],
    log: [1, 2],
    wait: [1, 2]
  )
end
