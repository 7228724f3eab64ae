defmodule CellaTest.StreamUnitTest do
  # The stream machinery against a stand-in HTTP server on a local socket: keep-alive
  # comments do not hold an idle stream open, and events split across TCP writes come whole.
  use ExUnit.Case, async: true

  alias Cella.EventStream

  # Serves one request: the answer's head, then `writes` (binaries, or {:sleep, ms}).
  defp serve(writes) do
    {:ok, listen} =
      :gen_tcp.listen(0, [:binary, active: false, ip: {127, 0, 0, 1}, reuseaddr: true])

    {:ok, port} = :inet.port(listen)

    spawn_link(fn ->
      {:ok, sock} = :gen_tcp.accept(listen)
      {:ok, _request} = :gen_tcp.recv(sock, 0, 5000)

      :gen_tcp.send(
        sock,
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nx-request-id: req-fake\r\n\r\n"
      )

      for w <- writes do
        case w do
          {:sleep, ms} ->
            Process.sleep(ms)

          :end ->
            :gen_tcp.send(sock, "0\r\n\r\n")

          bin ->
            :gen_tcp.send(sock, Integer.to_string(byte_size(bin), 16) <> "\r\n" <> bin <> "\r\n")
        end
      end

      Process.sleep(10_000)
      :gen_tcp.close(sock)
    end)

    Cella.Config.resolve(server: "http://127.0.0.1:#{port}", api_key: "k")
  end

  defp handle(%{event: "tick"} = ev, acc), do: {:cont, [EventStream.json(ev)], acc}
  defp handle(_, acc), do: {:cont, [], acc}

  test "keep-alive comments do not count as events for the idle timeout" do
    keepalives = List.flatten(for _ <- 1..40, do: [": keep-alive\n\n", {:sleep, 100}])
    c = serve(["event: tick\ndata: 1\n\n" | keepalives])

    {:ok, stream} =
      EventStream.open(c, :get, "/x", [idle_timeout: 1], nil, &handle/2, fn _ -> :ok end)

    t0 = System.monotonic_time(:millisecond)
    assert Enum.to_list(stream) == [1]
    # ended by the idle timeout (about 1 s), long before the 4 s of keep-alives
    assert System.monotonic_time(:millisecond) - t0 < 3500
    assert stream.request_id == "req-fake"
  end

  test "an event split across writes comes whole; the end of the answer ends the stream" do
    c =
      serve([
        "event: ti",
        {:sleep, 50},
        "ck\ndata: ",
        {:sleep, 50},
        "2\n",
        "\nevent: tick\ndata: 3\n\n",
        :end
      ])

    {:ok, stream} = EventStream.open(c, :get, "/x", [], nil, &handle/2, fn _ -> :ok end)
    assert Enum.to_list(stream) == [2, 3]
  end

  test "an answer that ends before its last event is an error" do
    c = serve(["event: tick\ndata: 4\n\n", :end])
    ended = fn _ -> {:error, Cella.Error.new("STREAM_ENDED", "ended early")} end
    {:ok, stream} = EventStream.open(c, :get, "/x", [], nil, &handle/2, ended)
    assert_raise Cella.Error, ~r/STREAM_ENDED/, fn -> Enum.to_list(stream) end
  end
end
