defmodule Cella.HTTP do
  @moduledoc false
  # HTTP over OTP's :httpc: the bearer key, error envelopes turned into %Cella.Error{}, 429
  # answers sent again after Retry-After, and answers streamed to the calling process.

  alias Cella.{Config, Error, JSON}

  @version Mix.Project.config()[:version]
  @connect_timeout 10_000

  @type response :: %{status: non_neg_integer, headers: [{String.t(), String.t()}], body: binary}

  @doc "A path segment, escaped."
  def seg(value), do: value |> to_string() |> URI.encode(&URI.char_unreserved?/1)

  @doc "`/sandboxes/ID/rest...`"
  def sandbox_path(id, rest \\ []), do: Enum.join(["/sandboxes", seg(id) | List.wrap(rest)], "/")

  @doc "A request answered whole: `{:ok, response}` for a 2xx answer, else the error."
  @spec request(Config.t(), atom, String.t(), keyword) :: {:ok, response} | {:error, Error.t()}
  def request(%Config{} = c, method, path, opts \\ []) do
    ensure_started()
    do_request(c, method, path, opts, 0)
  end

  defp do_request(c, method, path, opts, attempt) do
    {req, http_opts} = build(c, method, path, opts, timeout_ms(c, opts))

    case :httpc.request(method, req, http_opts, [body_format: :binary], :default) do
      {:ok, {{_, status, _}, headers, body}} ->
        headers = normalize_headers(headers)
        resp = %{status: status, headers: headers, body: body}

        cond do
          status in 200..299 ->
            {:ok, resp}

          status == 429 and attempt < c.max_retries ->
            Process.sleep(round(retry_wait(c, headers) * 1000))
            do_request(c, method, path, opts, attempt + 1)

          true ->
            {:error, error_of(status, headers, body)}
        end

      {:error, why} ->
        {:error, transport_error(why)}
    end
  end

  @doc "The `data` of a JSON answer (`whole: true`: the whole decoded body)."
  @spec data(Config.t(), atom, String.t(), keyword) :: {:ok, term} | {:error, Error.t()}
  def data(c, method, path, opts \\ []) do
    with {:ok, resp} <- request(c, method, path, opts),
         {:ok, decoded} <- JSON.decode(resp.body) do
      cond do
        opts[:whole] -> {:ok, decoded}
        is_map(decoded) and Map.has_key?(decoded, "data") -> {:ok, decoded["data"]}
        true -> {:ok, decoded}
      end
    end
  end

  @doc """
  Starts a request whose answer is streamed to the calling process. Answers once the status
  is known: `{:ok, %{ref, headers, request_id}}` for a 200 (then read it with `recv/2`), or
  the error.
  """
  def open_stream(%Config{} = c, method, path, opts \\ []) do
    ensure_started()
    do_open(c, method, path, opts, 0)
  end

  defp do_open(c, method, path, opts, attempt) do
    {req, http_opts} = build(c, method, path, opts, :infinity)
    wait = round((opts[:open_timeout] || c.request_timeout) * 1000)

    case :httpc.request(method, req, http_opts, sync: false, stream: :self, body_format: :binary) do
      {:ok, ref} ->
        receive do
          {:http, {^ref, :stream_start, headers}} ->
            headers = normalize_headers(headers)
            {:ok, %{ref: ref, headers: headers, request_id: header(headers, "x-request-id")}}

          {:http, {^ref, {{_, status, _}, headers, body}}} ->
            headers = normalize_headers(headers)

            cond do
              status in 200..299 ->
                # A short answer that came whole: replay it as the stream.
                send(self(), {:http, {ref, :stream, body}})
                send(self(), {:http, {ref, :stream_end, []}})
                {:ok, %{ref: ref, headers: headers, request_id: header(headers, "x-request-id")}}

              status == 429 and attempt < c.max_retries ->
                Process.sleep(round(retry_wait(c, headers) * 1000))
                do_open(c, method, path, opts, attempt + 1)

              true ->
                {:error, error_of(status, headers, body)}
            end

          {:http, {^ref, {:error, why}}} ->
            {:error, transport_error(why)}
        after
          wait ->
            cancel(ref)

            {:error,
             Error.new("TIMEOUT", "no answer from the Cella server within #{div(wait, 1000)} s")}
        end

      {:error, why} ->
        {:error, transport_error(why)}
    end
  end

  @doc "The next piece of a streamed answer: `{:data, bin}`, `:done`, `{:error, e}` or `:timeout`."
  def recv(ref, timeout_ms) do
    receive do
      {:http, {^ref, :stream, bin}} -> {:data, bin}
      {:http, {^ref, :stream_end, _}} -> :done
      {:http, {^ref, {:error, why}}} -> {:error, transport_error(why)}
    after
      timeout_ms -> :timeout
    end
  end

  @doc "Stops a streamed answer and drops what it left in the mailbox."
  def cancel(ref) do
    :httpc.cancel_request(ref)
    flush(ref)
  end

  defp flush(ref) do
    receive do
      {:http, {^ref, _}} -> flush(ref)
    after
      0 -> :ok
    end
  end

  # ---------------------------------------------------------------- plumbing

  defp ensure_started do
    {:ok, _} = Application.ensure_all_started(:inets)
    {:ok, _} = Application.ensure_all_started(:ssl)
    :ok
  end

  defp timeout_ms(c, opts) do
    case Keyword.get(opts, :timeout, c.request_timeout) do
      :infinity -> :infinity
      nil -> :infinity
      s -> round(s * 1000)
    end
  end

  defp build(c, method, path, opts, timeout) do
    url = if(opts[:root], do: c.server, else: Config.api_url(c)) <> path <> query(opts[:params])

    headers =
      [
        {"user-agent", "cella-elixir/#{@version}"},
        {"accept", "application/json"},
        # One connection per request: the server closes a kept-alive connection after answering
        # before reading a body (401, 403, 404, 429...), which would fail the next request on it.
        {"connection", "close"}
      ] ++
        if(c.api_key, do: [{"authorization", "Bearer " <> c.api_key}], else: []) ++
        c.headers ++ Keyword.get(opts, :headers, [])

    hs = for {k, v} <- headers, do: {to_charlist(k), to_charlist(v)}

    req =
      cond do
        Keyword.has_key?(opts, :json) ->
          {to_charlist(url), hs, ~c"application/json", JSON.encode!(opts[:json])}

        Keyword.has_key?(opts, :body) ->
          {to_charlist(url), hs, to_charlist(opts[:content_type] || "application/octet-stream"),
           body(opts[:body])}

        method in [:post, :put, :patch] ->
          {to_charlist(url), hs, ~c"application/json", ""}

        true ->
          {to_charlist(url), hs}
      end

    connect = if timeout == :infinity, do: @connect_timeout, else: min(@connect_timeout, timeout)
    http_opts = [timeout: timeout, connect_timeout: connect, autoredirect: false]

    http_opts =
      if String.starts_with?(url, "https:"),
        do: [{:ssl, ssl_opts(c, URI.parse(url).host)} | http_opts],
        else: http_opts

    {req, http_opts}
  end

  # A binary is sent as it is; any other enumerable of iodata (a `File.stream!/3`...) is sent
  # piece by piece with chunked transfer encoding, read only as it is sent (and read again
  # from its start if the request is sent again after a 429).
  defp body(b) when is_binary(b), do: b

  defp body(enum) do
    start = &Enumerable.reduce(enum, &1, fn x, _ -> {:suspend, x} end)
    {:chunkify, &next_piece/1, start}
  end

  defp next_piece(:eof), do: :eof

  defp next_piece(k) do
    case k.({:cont, nil}) do
      {:suspended, piece, k2} ->
        case IO.iodata_to_binary(piece) do
          "" -> next_piece(k2)
          bin -> {:ok, bin, k2}
        end

      {:done, _} ->
        :eof

      {:halted, _} ->
        :eof
    end
  end

  @doc false
  def ssl_opts(c, host) do
    base = [
      verify: :verify_peer,
      cacerts: :public_key.cacerts_get(),
      depth: 4,
      server_name_indication: to_charlist(host),
      customize_hostname_check: [match_fun: :public_key.pkix_verify_hostname_match_fun(:https)]
    ]

    base = if Keyword.has_key?(c.ssl, :cacertfile), do: Keyword.delete(base, :cacerts), else: base

    Keyword.merge(base, c.ssl)
  end

  @doc false
  def query(nil), do: ""
  def query([]), do: ""

  def query(params) do
    pairs =
      for {k, v} <- params, v != nil do
        v =
          case v do
            true -> "true"
            false -> "false"
            v -> to_string(v)
          end

        {to_string(k), v}
      end

    if pairs == [], do: "", else: "?" <> URI.encode_query(pairs, :rfc3986)
  end

  defp normalize_headers(headers),
    do: for({k, v} <- headers, do: {k |> to_string() |> String.downcase(), to_string(v)})

  def header(headers, name) do
    Enum.find_value(headers, fn {k, v} -> if k == name, do: v end)
  end

  defp retry_wait(c, headers) do
    secs =
      case Float.parse(header(headers, "retry-after") || "1") do
        {f, _} when f >= 0 -> f
        _ -> 1.0
      end

    min(secs, c.max_retry_wait)
  end

  defp error_of(status, headers, body) do
    retry =
      case header(headers, "retry-after") do
        nil ->
          nil

        v ->
          case Float.parse(v) do
            {f, _} -> f
            :error -> nil
          end
      end

    Error.from_body(status, body, request_id: header(headers, "x-request-id"), retry_after: retry)
  end

  defp transport_error(:timeout),
    do: Error.new("TIMEOUT", "timed out talking to the Cella server")

  defp transport_error(why),
    do: Error.new("CONNECTION_ERROR", "could not talk to the Cella server: #{inspect(why)}")
end
