defmodule Cella.Config do
  @moduledoc """
  Where the server is and how to talk to it: options first, then the environment.

  Every call takes these options (as the last keyword list), and a `%Cella.Sandbox{}` carries
  the ones it was made with:

  * `:server` - the server's base URL (`http://host:port`; a trailing `/api/v1` is taken
    too). Default `$CELLA_SERVER`, else `http://127.0.0.1:7070`.
  * `:api_key` - default `$CELLA_API_KEY`.
  * `:max_retries` - how many times a request answered 429 is sent again after waiting its
    `Retry-After` (default 3, each wait at most `:max_retry_wait`, 60 s).
  * `:request_timeout` - seconds an ordinary call may take (default 120); calls that run a
    command wait as long as the command may run.
  * `:headers` - extra request headers, `[{"x-name", "value"}]`.
  * `:ssl` - extra `:ssl` options for `https` servers (for instance `cacertfile: path`); by
    default the peer is verified against the system's CA store (`:public_key.cacerts_get/0`)
    with the host name checked.
  """

  defstruct server: "http://127.0.0.1:7070",
            api_key: nil,
            max_retries: 3,
            max_retry_wait: 60.0,
            request_timeout: 120.0,
            headers: [],
            ssl: []

  @type t :: %__MODULE__{}

  @keys [:server, :api_key, :max_retries, :max_retry_wait, :request_timeout, :headers, :ssl]

  @doc "The options of the connection, out of a keyword list (others are left alone)."
  def keys, do: @keys

  @doc "A configuration from options (a `%Cella.Config{}` is taken as it is) and the environment."
  @spec resolve(keyword | t) :: t
  def resolve(%__MODULE__{} = c), do: c

  def resolve(opts) when is_list(opts) do
    case Keyword.get(opts, :config) do
      %__MODULE__{} = c ->
        struct(c, Keyword.take(opts, @keys))

      nil ->
        server = opts[:server] || System.get_env("CELLA_SERVER") || "http://127.0.0.1:7070"

        api_key =
          Keyword.get_lazy(opts, :api_key, fn ->
            case System.get_env("CELLA_API_KEY") do
              "" -> nil
              k -> k
            end
          end)

        %__MODULE__{
          server: normalize(server),
          api_key: api_key,
          max_retries: Keyword.get(opts, :max_retries, 3),
          max_retry_wait: Keyword.get(opts, :max_retry_wait, 60.0),
          request_timeout: Keyword.get(opts, :request_timeout, 120.0),
          headers: Keyword.get(opts, :headers, []),
          ssl: Keyword.get(opts, :ssl, [])
        }
    end
  end

  @doc "The API's base URL (`.../api/v1`)."
  def api_url(%__MODULE__{server: s}), do: s <> "/api/v1"

  defp normalize(server) do
    s = server |> String.trim() |> String.trim_trailing("/")
    s = if String.contains?(s, "://"), do: s, else: "http://" <> s
    s = if String.ends_with?(s, "/api/v1"), do: String.slice(s, 0, byte_size(s) - 7), else: s
    s
  end

  defimpl Inspect do
    # The key and the headers (a session's cookie) are secrets: never shown.
    def inspect(c, _opts) do
      key = if c.api_key, do: "[redacted]", else: "nil"
      "#Cella.Config<server: #{c.server}, api_key: #{key}>"
    end
  end
end
