defmodule Cella do
  @moduledoc """
  Client for the Cella sandbox platform's API.

      {:ok, sb} = Cella.Sandbox.create(size: "xs")
      {:ok, result} = Cella.Commands.run(sb, "echo hello")
      result.stdout  #=> "hello\\n"
      Cella.Sandbox.kill(sb)

  Every call answers `{:ok, value}` or `{:error, %Cella.Error{}}`; each has a `!` variant
  that answers the value and raises the error. Connection options (`:server`, `:api_key`,
  ...) are described in `Cella.Config`; by default `CELLA_SERVER` and `CELLA_API_KEY` are
  read from the environment.

  The modules: `Cella.Sandbox` (create, connect, list, lifecycle, timeout, usage, fork,
  snapshots, previews, one-shot runs), `Cella.Commands` (exec, streamed exec, background
  processes), `Cella.Files` (files and watches), `Cella.Code` (the code interpreter),
  `Cella.Pty` (the terminal), `Cella.Snapshot`, `Cella.Artifact`, `Cella.Template`,
  `Cella.Image`, `Cella.Task` (task runs), `Cella.Workspace` (workspaces, wallet, ledger,
  usage, members), `Cella.ApiKey`, `Cella.User`, `Cella.Session`.
  """

  @doc "The server's liveness (`GET /healthz`, no key needed): `{:ok, %{\"status\" => \"ok\", \"version\" => ...}}`."
  def health(opts \\ []) do
    {c, _} = split_opts(opts)
    Cella.HTTP.data(c, :get, "/healthz", root: true, whole: true)
  end

  @doc "The server's OpenAPI document (`GET /api/v1/openapi.json`), decoded."
  def openapi(opts \\ []) do
    {c, _} = split_opts(opts)
    Cella.HTTP.data(c, :get, "/openapi.json", whole: true)
  end

  @doc "The value of `{:ok, value}`; raises the error of `{:error, error}`."
  def unwrap!({:ok, value}), do: value
  def unwrap!(:ok), do: :ok
  def unwrap!({:error, %Cella.Error{} = e}), do: raise(e)

  @doc false
  defmacro defbang(specs) do
    for {name, arities} <- specs, arity <- List.wrap(arities) do
      args = Macro.generate_arguments(arity, __CALLER__.module)
      bang = String.to_atom("#{name}!")

      quote do
        @doc "Like `#{unquote(name)}/#{unquote(arity)}`, but answers the value and raises `Cella.Error`."
        def unquote(bang)(unquote_splicing(args)),
          do: Cella.unwrap!(unquote(name)(unquote_splicing(args)))
      end
    end
  end

  @doc false
  # Splits a call's options into the connection's (a %Cella.Config{}) and the rest.
  def split_opts(opts) do
    {conn, rest} = Keyword.split(opts, [:config | Cella.Config.keys()])
    {Cella.Config.resolve(conn), rest}
  end

  @doc false
  def seconds(nil), do: nil
  def seconds(s) when is_integer(s), do: s
  def seconds(s) when is_float(s), do: s |> Float.ceil() |> trunc()

  @doc false
  # Reads every page of a list route (up to `limit` items).
  def pages(config, path, params, limit, mod) do
    do_pages(config, path, params, limit, nil, [], mod)
  end

  defp do_pages(config, path, params, limit, cursor, acc, mod) do
    have = length(acc)
    size = if limit, do: max(1, min(1000, limit - have)), else: 1000
    ps = params ++ [limit: size, cursor: cursor]

    with {:ok, page} <- Cella.HTTP.data(config, :get, path, params: ps, whole: true) do
      items = Enum.map(page["data"] || [], &mod.from_map/1)
      acc = acc ++ items

      cond do
        limit && length(acc) >= limit -> {:ok, Enum.take(acc, limit)}
        page["next_cursor"] in [nil, ""] or items == [] -> {:ok, acc}
        true -> do_pages(config, path, params, limit, page["next_cursor"], acc, mod)
      end
    end
  end
end
