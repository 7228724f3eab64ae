defmodule Cella.Pty do
  @moduledoc """
  An interactive terminal in a sandbox (`GET .../pty`, a WebSocket), over a small WebSocket
  client of this SDK's own (RFC 6455 over `:gen_tcp`, or `:ssl` for `https` servers: OTP has
  none).

      {:ok, pty} = Cella.Pty.open(sb, cols: 100, rows: 30)
      :ok = Cella.Pty.send_input(pty, "ls /\\n")
      :ok = Cella.Pty.send_input(pty, "exit\\n")
      for {:output, bytes} <- Cella.Pty.stream(pty), do: IO.write(bytes)

  `stream/2` gives `{:output, bytes}` as the program writes, then `{:exit, code}` when it
  ends (nothing more after a close without one). A `Cella.Pty` is used by the process that
  opened it.
  """

  import Cella, only: [defbang: 1]
  alias Cella.{Error, JSON}

  defstruct [:mod, :socket, buf: "", frag: nil]

  @type t :: %__MODULE__{}
  @guid "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

  @doc """
  Opens a terminal. Options: `:cols`, `:rows` (default 80 x 24), `:command` (a shell line
  instead of the login shell), `:user`, `:cwd`.
  """
  @spec open(Cella.Sandbox.t(), keyword) :: {:ok, t} | {:error, Error.t()}
  def open(%Cella.Sandbox{config: c} = sb, opts \\ []) do
    uri = URI.parse(c.server)
    query = Cella.HTTP.query(Keyword.take(opts, [:cols, :rows, :command, :user, :cwd]))
    path = (uri.path || "") <> "/api/v1/sandboxes/" <> Cella.HTTP.seg(sb.id) <> "/pty" <> query
    host = to_charlist(uri.host)
    timeout = round(c.request_timeout * 1000)

    {mod, connect} =
      if uri.scheme == "https",
        do:
          {:ssl,
           fn ->
             :ssl.connect(
               host,
               uri.port,
               [:binary, active: false] ++ Cella.HTTP.ssl_opts(c, uri.host),
               timeout
             )
           end},
        else:
          {:gen_tcp, fn -> :gen_tcp.connect(host, uri.port, [:binary, active: false], timeout) end}

    key = Base.encode64(:crypto.strong_rand_bytes(16))

    headers =
      [
        {"host", "#{uri.host}:#{uri.port}"},
        {"upgrade", "websocket"},
        {"connection", "Upgrade"},
        {"sec-websocket-key", key},
        {"sec-websocket-version", "13"},
        {"user-agent", "cella-elixir"}
      ] ++ if(c.api_key, do: [{"authorization", "Bearer " <> c.api_key}], else: []) ++ c.headers

    request = [
      "GET ",
      path,
      " HTTP/1.1\r\n",
      Enum.map(headers, fn {k, v} -> [k, ": ", v, "\r\n"] end),
      "\r\n"
    ]

    with {:ok, sock} <- wrap(connect.()),
         :ok <- wrap(mod.send(sock, request)),
         {:ok, status, hs, rest} <- read_head(mod, sock, "", timeout) do
      accept = :crypto.hash(:sha, key <> @guid) |> Base.encode64()

      cond do
        status == 101 and Cella.HTTP.header(hs, "sec-websocket-accept") == accept ->
          {:ok, %__MODULE__{mod: mod, socket: sock, buf: rest}}

        status == 101 ->
          mod.close(sock)
          {:error, Error.new("CONNECTION_ERROR", "the server's WebSocket handshake did not match")}

        true ->
          body = read_body(mod, sock, rest, Cella.HTTP.header(hs, "content-length"), timeout)
          mod.close(sock)
          {:error, Error.from_body(status, body, request_id: Cella.HTTP.header(hs, "x-request-id"))}
      end
    end
  end

  defp wrap({:ok, _} = ok), do: ok
  defp wrap(:ok), do: :ok
  defp wrap({:error, why}), do: {:error, Error.new("CONNECTION_ERROR", "terminal: #{inspect(why)}")}

  defp read_head(mod, sock, acc, timeout) do
    case :binary.split(acc, "\r\n\r\n") do
      [head, rest] ->
        [status_line | lines] = String.split(head, "\r\n")
        [_, code | _] = String.split(status_line, " ")

        hs =
          for l <- lines,
              [k, v] <- [String.split(l, ":", parts: 2)],
              do: {String.downcase(k), String.trim(v)}

        {:ok, String.to_integer(code), hs, rest}

      [_] ->
        with {:ok, more} <- wrap(mod.recv(sock, 0, timeout)),
             do: read_head(mod, sock, acc <> more, timeout)
    end
  end

  defp read_body(mod, sock, acc, len, timeout) do
    want = if len, do: String.to_integer(len), else: 0

    if byte_size(acc) >= want do
      acc
    else
      case mod.recv(sock, 0, timeout) do
        {:ok, more} -> read_body(mod, sock, acc <> more, len, timeout)
        _ -> acc
      end
    end
  end

  @doc "Types bytes into the terminal (a binary frame)."
  @spec send_input(t, iodata) :: :ok | {:error, Error.t()}
  def send_input(%__MODULE__{} = p, data), do: send_frame(p, 2, IO.iodata_to_binary(data))

  @doc "Resizes the terminal."
  @spec resize(t, pos_integer, pos_integer) :: :ok | {:error, Error.t()}
  def resize(%__MODULE__{} = p, cols, rows),
    do: send_frame(p, 1, JSON.encode!(%{resize: %{cols: cols, rows: rows}}))

  @doc "Closes the terminal (the program is hung up)."
  @spec close(t) :: :ok
  def close(%__MODULE__{mod: mod, socket: s} = p) do
    _ = send_frame(p, 8, <<1000::16>>)
    mod.close(s)
    :ok
  end

  @doc """
  The next thing the terminal says: `{:ok, {:output, bytes}}`, `{:ok, {:exit, code}}`,
  `{:ok, :closed}` (the server closed the socket), with the updated terminal; `timeout` in
  milliseconds gives `{:error, %Cella.Error{reason: :timeout}}`.
  """
  @spec recv(t, timeout) :: {:ok, term, t} | {:error, Error.t()}
  def recv(%__MODULE__{} = p, timeout \\ :infinity) do
    case parse_frame(p.buf) do
      {:ok, fin, op, payload, rest} ->
        p = %{p | buf: rest}
        handle(p, fin, op, payload, timeout)

      :more ->
        case p.mod.recv(p.socket, 0, timeout) do
          {:ok, more} -> recv(%{p | buf: p.buf <> more}, timeout)
          {:error, :timeout} -> {:error, Error.new("TIMEOUT", "the terminal said nothing in time")}
          {:error, :closed} -> {:ok, :closed, p}
          {:error, why} -> {:error, Error.new("CONNECTION_ERROR", "terminal: #{inspect(why)}")}
        end
    end
  end

  # 0 continuation, 1 text, 2 binary, 8 close, 9 ping, 10 pong
  defp handle(p, false, op, payload, t) when op in [1, 2], do: recv(%{p | frag: {op, payload}}, t)

  defp handle(%{frag: {op0, acc}} = p, fin, 0, payload, t) do
    if fin,
      do: message(%{p | frag: nil}, op0, acc <> payload, t),
      else: recv(%{p | frag: {op0, acc <> payload}}, t)
  end

  defp handle(p, true, op, payload, t) when op in [1, 2], do: message(p, op, payload, t)

  defp handle(p, _, 9, payload, t) do
    _ = send_frame(p, 10, payload)
    recv(p, t)
  end

  defp handle(p, _, 8, _payload, _t) do
    _ = send_frame(p, 8, <<1000::16>>)
    p.mod.close(p.socket)
    {:ok, :closed, p}
  end

  defp handle(p, _, _op, _payload, t), do: recv(p, t)

  defp message(p, 2, bytes, _t), do: {:ok, {:output, bytes}, p}

  defp message(p, 1, text, t) do
    case JSON.decode(text) do
      {:ok, %{"exit" => %{"exit_code" => code}}} -> {:ok, {:exit, code}, p}
      {:ok, _} -> recv(p, t)
      {:error, _} -> {:ok, {:output, text}, p}
    end
  end

  @doc false
  def parse_frame(<<fin::1, _::3, op::4, 0::1, len::7, rest::binary>>) do
    {len, rest} =
      case {len, rest} do
        {126, <<l::16, r::binary>>} -> {l, r}
        {127, <<l::64, r::binary>>} -> {l, r}
        {126, _} -> {:more, rest}
        {127, _} -> {:more, rest}
        {l, r} -> {l, r}
      end

    case rest do
      _ when len == :more -> :more
      <<payload::binary-size(len), tail::binary>> -> {:ok, fin == 1, op, payload, tail}
      _ -> :more
    end
  end

  def parse_frame(_), do: :more

  @doc false
  def encode_frame(op, payload, mask \\ :crypto.strong_rand_bytes(4)) do
    n = byte_size(payload)

    len =
      cond do
        n < 126 -> <<1::1, n::7>>
        n < 65_536 -> <<1::1, 126::7, n::16>>
        true -> <<1::1, 127::7, n::64>>
      end

    keys = :binary.copy(mask, div(n, 4) + 1) |> binary_part(0, n)
    [<<1::1, 0::3, op::4>>, len, mask, :crypto.exor(payload, keys)]
  end

  defp send_frame(%__MODULE__{mod: mod, socket: s}, op, payload) do
    case mod.send(s, encode_frame(op, payload)) do
      :ok -> :ok
      {:error, why} -> {:error, Error.new("CONNECTION_ERROR", "terminal: #{inspect(why)}")}
    end
  end

  @doc """
  The terminal's output as a stream: `{:output, bytes}` items, then `{:exit, code}`; it ends
  there, or when the server closes the socket. Leaving it early closes the terminal.
  """
  @spec stream(t, timeout) :: Enumerable.t()
  def stream(%__MODULE__{} = p, timeout \\ :infinity) do
    Stream.resource(
      fn -> p end,
      fn
        {:done, p} ->
          {:halt, {:done, p}}

        p ->
          case recv(p, timeout) do
            {:ok, {:output, b}, p} -> {[{:output, b}], p}
            {:ok, {:exit, code}, p} -> {[{:exit, code}], {:done, p}}
            {:ok, :closed, p} -> {:halt, {:done, p}}
            {:error, e} -> raise e
          end
      end,
      fn
        {:done, p} -> p.mod.close(p.socket)
        p -> close(p)
      end
    )
  end

  defbang(open: [1, 2])
end
