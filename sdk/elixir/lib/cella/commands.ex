defmodule Cella.Commands do
  @moduledoc """
  Commands inside a sandbox: run to their end (`run/3`), streamed as they run (`stream/3`),
  or started in the background (`start/3`) and followed (`output/3`, `wait/3`).

      {:ok, r} = Cella.Commands.run(sb, "echo hi; echo err >&2")
      r.stdout   #=> "hi\\n"

      {:ok, stream} = Cella.Commands.stream(sb, "for i in 1 2 3; do echo $i; sleep 1; done")
      for %Cella.OutputChunk{stream: :stdout, data: d} <- stream, do: IO.write(d)

  A command is a shell line (run by `bash -c`) or a list of arguments. Options shared by
  these calls: `:env` (a map), `:cwd`, `:user` (`"user"`, the default, or `"root"`),
  `:timeout` (seconds; the server's default is 3600), `:stdin` (text written to its standard
  input; not for `start/3`), `:tag` (`start/3`: a label).
  """

  import Cella, only: [defbang: 1]
  alias Cella.{HTTP, Error, EventStream, SSE, CommandResult, ProcessInfo, OutputChunk}

  @margin 30

  @doc false
  def command_body(cmd, o) do
    base =
      cond do
        is_binary(cmd) -> %{command: cmd}
        is_list(cmd) -> %{argv: Enum.map(cmd, &to_string/1)}
      end

    %{
      env: o[:env],
      cwd: o[:cwd],
      user: o[:user],
      timeout_sec: Cella.seconds(o[:timeout]),
      stdin: o[:stdin],
      tag: o[:tag]
    }
    |> Enum.reject(fn {_, v} -> is_nil(v) end)
    |> Map.new()
    |> Map.merge(base)
  end

  @doc false
  def exit_error(code, stdout, stderr, timed_out) do
    tail =
      if(stderr in [nil, ""], do: stdout || "", else: stderr)
      |> String.trim()
      |> String.split("\n")
      |> Enum.take(-3)
      |> Enum.join(" | ")

    msg = "command exited with code #{code}" <> if(timed_out, do: " (timed out)", else: "")
    msg = if tail == "", do: msg, else: msg <> ": " <> tail

    Error.new("COMMAND_EXIT", msg,
      details: %{"exit_code" => code, "stdout" => stdout, "stderr" => stderr}
    )
  end

  defp http_timeout(o), do: (Cella.seconds(o[:timeout]) || 3600) + @margin

  @doc """
  Runs a command to its end: `{:ok, %Cella.CommandResult{}}` (any exit code), or with
  `check: true` an error `COMMAND_EXIT` (`reason: :command_exit`) for one other than 0.
  With `on_stdout:`/`on_stderr:` (functions of one binary) the output is streamed and each
  piece passed to them as it comes. `background: true` is `start/3`.
  """
  @spec run(Cella.Sandbox.t(), String.t() | [String.t()], keyword) ::
          {:ok, CommandResult.t() | ProcessInfo.t()} | {:error, Error.t()}
  def run(sb, cmd, opts \\ []) do
    cond do
      opts[:background] ->
        with {:ok, p} <- start(sb, cmd, Keyword.delete(opts, :stdin)) do
          if opts[:stdin], do: send_stdin(sb, p.pid, opts[:stdin], close: true), else: {:ok, p}
        end

      opts[:on_stdout] || opts[:on_stderr] ->
        with {:ok, stream} <- stream(sb, cmd, opts) do
          collect(stream, opts)
        end
        |> check(opts)

      true ->
        body = command_body(cmd, opts)

        with {:ok, d} <-
               HTTP.data(sb.config, :post, HTTP.sandbox_path(sb.id, "exec"),
                 json: body,
                 timeout: http_timeout(opts)
               ) do
          {:ok, CommandResult.from_map(d)}
        end
        |> check(opts)
    end
  end

  defp check({:ok, %CommandResult{exit_code: c} = r}, opts) when c != 0 do
    if opts[:check], do: {:error, exit_error(c, r.stdout, r.stderr, r.timed_out)}, else: {:ok, r}
  end

  defp check(other, _), do: other

  # Folds a stream of chunks (and its last CommandResult) into one result.
  defp collect(stream, opts) do
    {out, err, res} =
      Enum.reduce(stream, {[], [], nil}, fn
        %OutputChunk{stream: :stdout, data: d}, {o, e, r} ->
          if opts[:on_stdout], do: opts[:on_stdout].(d)
          {[o | d], e, r}

        %OutputChunk{stream: :stderr, data: d}, {o, e, r} ->
          if opts[:on_stderr], do: opts[:on_stderr].(d)
          {o, [e | d], r}

        %CommandResult{} = r, {o, e, _} ->
          {o, e, r}
      end)

    {:ok, %{res | stdout: IO.iodata_to_binary(out), stderr: IO.iodata_to_binary(err)}}
  rescue
    e in Error -> {:error, e}
  end

  @doc """
  Runs a command and streams its output (`POST .../exec/stream`): `{:ok, stream}` once the
  server took it, where `stream` (a `Cella.EventStream`) gives `%Cella.OutputChunk{}`s as
  the command writes, then one `%Cella.CommandResult{}` (exit code, duration, `timed_out`;
  its `stdout`/`stderr` are empty, the output came as chunks). Leaving the stream early kills
  the command.
  """
  @spec stream(Cella.Sandbox.t(), String.t() | [String.t()], keyword) ::
          {:ok, EventStream.t()} | {:error, Error.t()}
  def stream(sb, cmd, opts \\ []) do
    body = command_body(cmd, opts)
    deadline = System.monotonic_time(:millisecond) + http_timeout(opts) * 1000

    EventStream.open(
      sb.config,
      :post,
      HTTP.sandbox_path(sb.id, ["exec", "stream"]),
      [json: body, deadline: deadline],
      nil,
      &output_event/2,
      &output_end/1
    )
  end

  @doc false
  def output_event(%{event: e} = ev, acc) when e in ["stdout", "stderr"] do
    {:cont, [%OutputChunk{stream: String.to_atom(e), data: SSE.output_bytes(EventStream.json(ev))}],
     acc}
  end

  def output_event(%{event: "exit"} = ev, _acc) do
    d = EventStream.json(ev) || %{}
    {:halt, [CommandResult.from_map(Map.merge(%{"stdout" => "", "stderr" => ""}, d))], :exited}
  end

  def output_event(%{event: "error"} = ev, _acc), do: {:error, EventStream.error_event(ev)}
  def output_event(_, acc), do: {:cont, [], acc}

  @doc false
  def output_end(:exited), do: :ok

  def output_end(_),
    do: {:error, Error.new("STREAM_ENDED", "the output stream ended before the command's exit")}

  # ------------------------------------------------------------------ background processes

  @doc "Starts a background process (no timeout of its own): `{:ok, %Cella.ProcessInfo{}}`."
  @spec start(Cella.Sandbox.t(), String.t() | [String.t()], keyword) ::
          {:ok, ProcessInfo.t()} | {:error, Error.t()}
  def start(sb, cmd, opts \\ []) do
    body = command_body(cmd, Keyword.drop(opts, [:timeout, :stdin]))
    proc(HTTP.data(sb.config, :post, ppath(sb), json: body))
  end

  @doc "The background processes started through the API (running, and the last that exited)."
  @spec list(Cella.Sandbox.t()) :: {:ok, [ProcessInfo.t()]} | {:error, Error.t()}
  def list(sb) do
    with {:ok, d} <- HTTP.data(sb.config, :get, ppath(sb)),
         do: {:ok, Cella.Model.list(d, ProcessInfo)}
  end

  @doc "One background process."
  def get(sb, pid), do: proc(HTTP.data(sb.config, :get, ppath(sb, [pid])))

  @doc "Sends a signal: a name (`\"TERM\"`, `\"SIGKILL\"`) or a number."
  def signal(sb, pid, signal \\ "TERM") do
    signal = if is_atom(signal), do: Atom.to_string(signal), else: signal
    proc(HTTP.data(sb.config, :post, ppath(sb, [pid, "signal"]), json: %{signal: signal}))
  end

  @doc "SIGKILLs a background process: `{:ok, false}` if it had exited already."
  def kill(sb, pid) do
    case signal(sb, pid, "KILL") do
      {:ok, _} -> {:ok, true}
      {:error, %Error{reason: :conflict}} -> {:ok, false}
      e -> e
    end
  end

  @doc "Writes to a process's standard input (`close: true` closes it afterwards)."
  def send_stdin(sb, pid, data, opts \\ []) do
    params = if opts[:close], do: [close: true], else: []

    proc(
      HTTP.data(sb.config, :post, ppath(sb, [pid, "stdin"]),
        params: params,
        body: IO.iodata_to_binary(data),
        content_type: "application/octet-stream"
      )
    )
  end

  @doc "Closes a process's standard input."
  def close_stdin(sb, pid), do: send_stdin(sb, pid, "", close: true)

  @doc """
  Follows a process's output until it exits: a stream of `%Cella.OutputChunk{}`s, then its
  `%Cella.CommandResult{}` (exit code). `from_start: false` skips what its buffer holds;
  `timeout:` (seconds) raises `TIMEOUT` if it has not exited by then.
  """
  @spec output(Cella.Sandbox.t(), pos_integer, keyword) ::
          {:ok, EventStream.t()} | {:error, Error.t()}
  def output(sb, pid, opts \\ []) do
    from = if Keyword.get(opts, :from_start, true), do: "start", else: "now"
    deadline = opts[:timeout] && System.monotonic_time(:millisecond) + round(opts[:timeout] * 1000)

    EventStream.open(
      sb.config,
      :get,
      ppath(sb, [pid, "output"]),
      [params: [from: from], deadline: deadline],
      nil,
      &output_event/2,
      &output_end/1
    )
  end

  @doc """
  Waits for a background process to exit and answers its result, with its output from the
  start of its buffer (`on_stdout:`, `on_stderr:`, `timeout:`, `check:` as for `run/3`).
  """
  @spec wait(Cella.Sandbox.t(), pos_integer, keyword) ::
          {:ok, CommandResult.t()} | {:error, Error.t()}
  def wait(sb, pid, opts \\ []) do
    with {:ok, stream} <- output(sb, pid, opts) do
      collect(stream, opts)
    end
    |> check(opts)
  end

  defp proc({:ok, d}), do: {:ok, ProcessInfo.from_map(d)}
  defp proc(e), do: e

  defp ppath(sb, rest \\ []),
    do: HTTP.sandbox_path(sb.id, ["processes" | Enum.map(rest, &HTTP.seg/1)])

  defbang(
    run: [2, 3],
    stream: [2, 3],
    start: [2, 3],
    list: 1,
    get: 2,
    signal: [2, 3],
    kill: 2,
    send_stdin: [3, 4],
    close_stdin: 2,
    output: [2, 3],
    wait: [2, 3]
  )
end
