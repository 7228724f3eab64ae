defmodule CellaTest.UnitsTest do
  # No server: the SSE decoder, the JSON codec's conventions, error mapping, configuration.
  use ExUnit.Case, async: true

  alias Cella.{SSE, Error, JSON, Config}

  @stream "event: stdout\ndata: \"a\\n\"\n\n: keep-alive\n\nevent: stderr\r\ndata: {\"b64\":\"/wA=\"}\r\n\r\n" <>
            "data: one\ndata: two\n\nevent: exit\ndata: {\"exit_code\":0}\n\n"

  @expected [
    %{event: "stdout", data: "\"a\\n\""},
    :keepalive,
    %{event: "stderr", data: "{\"b64\":\"/wA=\"}"},
    %{event: "message", data: "one\ntwo"},
    %{event: "exit", data: "{\"exit_code\":0}"}
  ]

  defp feed_all(chunks) do
    {events, st} =
      Enum.reduce(chunks, {[], SSE.new()}, fn c, {acc, st} ->
        {evs, st} = SSE.feed(st, c)
        {acc ++ evs, st}
      end)

    {rest, _} = SSE.flush(st)
    events ++ rest
  end

  test "SSE events come out the same however the bytes are split" do
    assert feed_all([@stream]) == @expected
    # every split into pieces of one to seven bytes, chosen by a seeded generator
    :rand.seed(:exsss, {1, 2, 3})

    for _ <- 1..200 do
      chunks = split_randomly(@stream, [])
      assert feed_all(chunks) == @expected, inspect(chunks)
    end

    # and every single split point
    for i <- 0..byte_size(@stream) do
      <<a::binary-size(i), b::binary>> = @stream
      assert feed_all([a, b]) == @expected
    end
  end

  defp split_randomly("", acc), do: Enum.reverse(acc)

  defp split_randomly(s, acc) do
    n = min(:rand.uniform(7), byte_size(s))
    <<a::binary-size(n), b::binary>> = s
    split_randomly(b, [a | acc])
  end

  test "an event the stream ends in without its blank line is not lost" do
    assert feed_all(["event: exit\ndata: {}"]) == [%{event: "exit", data: "{}"}]
  end

  test "output bytes: text as it is, base64 decoded" do
    assert SSE.output_bytes("hé") == "hé"
    assert SSE.output_bytes(%{"b64" => "/wA="}) == <<255, 0>>
  end

  test "JSON: null is nil both ways, atoms and structs encode" do
    assert JSON.decode!(~s({"a":null,"b":[1,2.5,true],"c":"é"})) == %{
             "a" => nil,
             "b" => [1, 2.5, true],
             "c" => "é"
           }

    assert JSON.decode!(JSON.encode!(%{a: nil, b: :x, c: [1, "two"]})) == %{
             "a" => nil,
             "b" => "x",
             "c" => [1, "two"]
           }

    assert {:error, %Error{code: "DECODE_ERROR"}} = JSON.decode("{not json")
  end

  test "an error envelope becomes a typed error" do
    body =
      ~s({"error":{"code":"SANDBOX_NOT_RUNNING","message":"paused","details":{"state":"paused"}}})

    e = Error.from_body(409, body, request_id: "req1")
    assert %Error{code: "SANDBOX_NOT_RUNNING", reason: :sandbox_not_running, status: 409} = e
    assert e.details == %{"state" => "paused"} and e.request_id == "req1"
    assert Exception.message(e) =~ "SANDBOX_NOT_RUNNING: paused (HTTP 409, request req1)"
    # a body that is not an envelope: the status decides
    assert %Error{code: "UNAVAILABLE", reason: :unavailable} =
             Error.from_body(503, "<html>bad gateway</html>")

    assert %Error{code: "HTTP_418", reason: :unknown} = Error.from_body(418, "")

    assert Error.field(
             Error.from_body(
               400,
               ~s({"error":{"code":"INVALID_REQUEST","message":"m","details":{"field":"size"}}})
             )
           ) == "size"
  end

  test "configuration: options first, then the environment; the key is never shown" do
    c = Config.resolve(server: "example.org:7070/api/v1/", api_key: "secret-key")
    assert c.server == "http://example.org:7070"
    assert Config.api_url(c) == "http://example.org:7070/api/v1"
    refute inspect(c) =~ "secret-key"
    refute inspect(%Cella.Sandbox{id: "sb1", config: c}) =~ "secret-key"
  end

  test "https servers are verified against the system's CA store, host name checked" do
    ssl = Cella.HTTP.ssl_opts(Config.resolve(server: "https://cella.example"), "cella.example")
    assert ssl[:verify] == :verify_peer
    assert is_list(ssl[:cacerts]) and ssl[:cacerts] != []
    assert ssl[:server_name_indication] == ~c"cella.example"
  end

  test "query strings drop nil values and spell booleans" do
    assert Cella.HTTP.query(path: "/a b", recursive: true, limit: nil) ==
             "?path=%2Fa%20b&recursive=true"
  end
end
