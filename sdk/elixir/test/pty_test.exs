defmodule CellaTest.PtyTest do
  use CellaTest.Case

  alias Cella.Pty

  test "WebSocket frames: encoded masked, decoded whole or from pieces" do
    frame = IO.iodata_to_binary(Pty.encode_frame(2, "hello", <<1, 2, 3, 4>>))
    assert <<0x82, 0x85, 1, 2, 3, 4, masked::binary>> = frame
    assert :crypto.exor(masked, <<1, 2, 3, 4, 1>>) == "hello"
    long = :binary.copy("x", 70_000)
    server = <<0x82, 127, 70_000::64, long::binary, 0x81, 2, "hi">>
    assert {:ok, true, 2, ^long, <<0x81, 2, "hi">>} = Pty.parse_frame(server)
    assert :more = Pty.parse_frame(binary_part(server, 0, 100))
    assert {:ok, true, 1, "hi", ""} = Pty.parse_frame(<<0x81, 2, "hi">>)
  end

  test "a terminal: input typed, resize, output, the exit code" do
    sb = sandbox!()

    {:ok, pty} =
      Pty.open(sb, command: "read line; stty size; echo got $line; exit 7", cols: 80, rows: 24)

    :ok = Pty.resize(pty, 120, 40)
    Process.sleep(200)
    :ok = Pty.send_input(pty, "typed\r")
    items = Pty.stream(pty, 60_000) |> Enum.to_list()
    out = for {:output, b} <- items, into: "", do: b
    assert out =~ "40 120"
    assert out =~ "got typed"
    assert List.last(items) == {:exit, 7}
  end

  test "errors come before the upgrade, typed" do
    sb = sandbox!()
    assert {:error, %Cella.Error{status: 400}} = Pty.open(sb, cols: 0)
    assert {:error, %Cella.Error{reason: :not_found}} = Pty.open(%{sb | id: "sb000000000000000000"})
  end
end
