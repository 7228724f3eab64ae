defmodule Cella.Files do
  @moduledoc ~S"""
  The sandbox's filesystem. Paths are absolute paths inside it.

      {:ok, _} = Cella.Files.write(sb, "/home/user/a.txt", "hello")
      {:ok, "hello"} = Cella.Files.read(sb, "/home/user/a.txt")

      {:ok, watch} = Cella.Files.watch(sb, "/home/user", recursive: true, timeout: 5)
      Enum.each(watch, fn %Cella.FilesystemEvent{type: t, path: p} -> IO.puts("#{t} #{p}") end)
  """

  import Cella, only: [defbang: 1]
  alias Cella.{HTTP, Error, Entry, EventStream, FilesystemEvent}

  @doc "A file's content, as a binary (the bytes as they are: text or not)."
  @spec read(Cella.Sandbox.t(), String.t(), keyword) :: {:ok, binary} | {:error, Error.t()}
  def read(sb, path, opts \\ []) do
    headers = if opts[:range], do: [{"range", "bytes=" <> opts[:range]}], else: []

    with {:ok, resp} <-
           HTTP.request(sb.config, :get, fpath(sb),
             params: [path: path],
             headers: headers,
             timeout: opts[:timeout] || sb.config.request_timeout + 600
           ) do
      {:ok, resp.body}
    end
  end

  @doc """
  A file's content as a stream of binaries, read as they come (for files too large to hold
  in memory): `{:ok, stream}`; `Stream.into(stream, File.stream!(dest))` copies it.
  """
  @spec read_stream(Cella.Sandbox.t(), String.t()) :: {:ok, Enumerable.t()} | {:error, Error.t()}
  def read_stream(sb, path), do: byte_stream(sb.config, fpath(sb), path: path)

  @doc false
  def byte_stream(config, path, params) do
    with {:ok, %{ref: ref}} <- HTTP.open_stream(config, :get, path, params: params) do
      {:ok,
       Stream.resource(
         fn -> :open end,
         fn
           :done ->
             {:halt, :done}

           :open ->
             case HTTP.recv(ref, round(config.request_timeout * 1000)) do
               {:data, bin} -> {[bin], :open}
               :done -> {:halt, :done}
               {:error, e} -> raise e
               :timeout -> raise Error.new("TIMEOUT", "the download stalled")
             end
         end,
         fn
           :done -> :ok
           _ -> HTTP.cancel(ref)
         end
       )}
    end
  end

  @doc """
  Writes a file, whole or nothing (missing parents are made). `data` is a binary, iodata, or
  any other enumerable of binaries (a `File.stream!(path, [], 65536)`), which is sent piece
  by piece as it is read.
  Options: `:mode` (`0o755` or `"0755"`), `:user` (who owns it). Answers its entry.

  `write(sb, [%{path: ..., data: ...}, ...])` writes several (each may give its own `:user`
  and `:mode`) and answers their entries.
  """
  @spec write(Cella.Sandbox.t(), String.t() | [map], iodata | keyword, keyword) ::
          {:ok, Entry.t() | [Entry.t()]} | {:error, Error.t()}
  def write(sb, path_or_files, data_or_opts \\ [], opts \\ [])

  def write(sb, files, opts, _) when is_list(files) do
    Enum.reduce_while(files, {:ok, []}, fn f, {:ok, acc} ->
      f = Map.new(f)
      o = Keyword.merge(opts, Enum.filter([user: f[:user], mode: f[:mode]], fn {_, v} -> v end))

      case write(sb, f[:path], f[:data], o) do
        {:ok, e} -> {:cont, {:ok, acc ++ [e]}}
        err -> {:halt, err}
      end
    end)
  end

  def write(sb, path, data, opts) when is_binary(path) do
    mode =
      case opts[:mode] do
        nil -> nil
        m when is_integer(m) -> m |> Integer.to_string(8) |> String.pad_leading(4, "0")
        m -> to_string(m)
      end

    body = if is_list(data) or is_binary(data), do: IO.iodata_to_binary(data), else: data

    with {:ok, d} <-
           HTTP.data(sb.config, :put, fpath(sb),
             params: [path: path, user: opts[:user], mode: mode],
             body: body,
             content_type: "application/octet-stream",
             timeout: sb.config.request_timeout + 600
           ) do
      {:ok, Entry.from_map(d)}
    end
  end

  @doc "A directory's entries (the whole tree with `recursive: true`; `limit:`), sorted by path."
  @spec list(Cella.Sandbox.t(), String.t(), keyword) :: {:ok, [Entry.t()]} | {:error, Error.t()}
  def list(sb, path, opts \\ []) do
    params = [path: path, recursive: opts[:recursive] || nil, limit: opts[:limit]]

    with {:ok, d} <- HTTP.data(sb.config, :get, fpath(sb, "list"), params: params) do
      {:ok, Cella.Model.list(d, Entry)}
    end
  end

  @doc "One path's entry (a symlink is described, not followed)."
  @spec stat(Cella.Sandbox.t(), String.t()) :: {:ok, Entry.t()} | {:error, Error.t()}
  def stat(sb, path) do
    with {:ok, d} <- HTTP.data(sb.config, :get, fpath(sb, "stat"), params: [path: path]) do
      {:ok, Entry.from_map(d)}
    end
  end

  @doc "Whether a path exists: `{:ok, boolean}`."
  def exists(sb, path) do
    case stat(sb, path) do
      {:ok, _} -> {:ok, true}
      {:error, %Error{reason: :not_found}} -> {:ok, false}
      e -> e
    end
  end

  @doc "Removes a file, a link or an empty directory (any directory with `recursive: true`)."
  @spec remove(Cella.Sandbox.t(), String.t(), keyword) :: :ok | {:error, Error.t()}
  def remove(sb, path, opts \\ []) do
    params = [path: path, recursive: opts[:recursive] || nil]

    with {:ok, _} <- HTTP.request(sb.config, :delete, fpath(sb), params: params), do: :ok
  end

  @doc "Makes a directory and its missing parents (fine if it exists)."
  def make_dir(sb, path) do
    with {:ok, d} <- HTTP.data(sb.config, :post, fpath(sb, "mkdir"), json: %{path: path}) do
      {:ok, Entry.from_map(d)}
    end
  end

  @doc "Moves `from` to `to` (replacing a file there); answers the entry at `to`."
  def rename(sb, from, to) do
    with {:ok, d} <- HTTP.data(sb.config, :post, fpath(sb, "move"), json: %{from: from, to: to}) do
      {:ok, Entry.from_map(d)}
    end
  end

  @doc """
  Follows the changes in a directory: `{:ok, stream}` once the watch is in place; the stream
  gives `%Cella.FilesystemEvent{}`s. `recursive: true` watches the whole tree; with
  `timeout:` (seconds) the stream ends once no event came for that long, else it runs until
  left (`Enum.take/2`...) or closed (`Cella.EventStream.close/1`).
  """
  @spec watch(Cella.Sandbox.t(), String.t(), keyword) ::
          {:ok, EventStream.t()} | {:error, Error.t()}
  def watch(sb, path, opts \\ []) do
    EventStream.open(
      sb.config,
      :get,
      fpath(sb, "watch"),
      [params: [path: path, recursive: opts[:recursive] || nil], idle_timeout: opts[:timeout]],
      nil,
      &watch_event/2,
      fn _ -> :ok end
    )
  end

  defp watch_event(%{event: e} = ev, acc) when e in ["create", "modify", "delete", "rename"] do
    d = EventStream.json(ev) || %{}

    {:cont,
     [
       %FilesystemEvent{
         type: String.to_atom(e),
         path: d["path"],
         dir?: d["dir"] == true,
         from: d["from"]
       }
     ], acc}
  end

  defp watch_event(%{event: "error"} = ev, _), do: {:error, EventStream.error_event(ev)}
  defp watch_event(_, acc), do: {:cont, [], acc}

  defp fpath(sb, rest \\ nil),
    do: HTTP.sandbox_path(sb.id, if(rest, do: ["files", rest], else: ["files"]))

  defbang(
    read: [2, 3],
    read_stream: 2,
    write: [2, 3, 4],
    list: [2, 3],
    stat: 2,
    exists: 2,
    remove: [2, 3],
    make_dir: 2,
    rename: 3,
    watch: [2, 3]
  )
end
