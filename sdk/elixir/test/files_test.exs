defmodule CellaTest.FilesTest do
  use CellaTest.Case

  alias Cella.{Files, Entry, FilesystemEvent}

  setup_all do
    sb = Cella.Sandbox.create!(size: size(), timeout: 1800)
    on_exit(fn -> Cella.Sandbox.kill(sb) end)
    %{sb: sb}
  end

  test "a 10 MiB file round trip keeps every byte (checked by SHA-256, in and out)", %{sb: sb} do
    data = :crypto.strong_rand_bytes(10 * 1024 * 1024)
    sum = :crypto.hash(:sha256, data) |> Base.encode16(case: :lower)

    assert {:ok, %Entry{size: 10_485_760, type: "file"}} =
             Files.write(sb, "/home/user/big.bin", data)

    # the sandbox computes the same checksum
    assert Cella.Commands.run!(sb, "sha256sum /home/user/big.bin").stdout =~ sum
    # whole, and streamed
    assert {:ok, back} = Files.read(sb, "/home/user/big.bin")
    assert :crypto.hash(:sha256, back) |> Base.encode16(case: :lower) == sum
    {:ok, stream} = Files.read_stream(sb, "/home/user/big.bin")
    chunks = Enum.to_list(stream)
    assert length(chunks) > 1
    assert :crypto.hash(:sha256, chunks) |> Base.encode16(case: :lower) == sum
  end

  test "an upload streamed from a local file", %{sb: sb} do
    local = Path.join(System.tmp_dir!(), "cella-elixir-upload-#{tag()}")
    data = :crypto.strong_rand_bytes(3 * 1024 * 1024 + 5)
    File.write!(local, data)
    on_exit(fn -> File.rm(local) end)

    assert {:ok, %Entry{size: size}} =
             Files.write(sb, "/home/user/streamed.bin", File.stream!(local, [], 65_536))

    assert size == byte_size(data)
    assert Files.read!(sb, "/home/user/streamed.bin") == data
  end

  test "write with a mode, stat, list, exists, make_dir, rename, remove", %{sb: sb} do
    assert {:ok, %Entry{mode: "0755"}} =
             Files.write(sb, "/home/user/d/run.sh", "#!/bin/sh\necho ran\n", mode: 0o755)

    assert Cella.Commands.run!(sb, "/home/user/d/run.sh").stdout == "ran\n"
    assert {:ok, %Entry{type: "dir"}} = Files.make_dir(sb, "/home/user/d/sub/deeper")

    assert {:ok, [_, _]} =
             Files.write(sb, [
               %{path: "/home/user/d/a.txt", data: "a"},
               %{path: "/home/user/d/b.txt", data: "bb"}
             ])

    assert {:ok, entries} = Files.list(sb, "/home/user/d")
    assert Enum.map(entries, & &1.name) |> Enum.sort() == ["a.txt", "b.txt", "run.sh", "sub"]
    assert {:ok, all} = Files.list(sb, "/home/user/d", recursive: true)
    assert Enum.any?(all, &(&1.path == "/home/user/d/sub/deeper"))
    assert {:ok, %Entry{size: 2}} = Files.stat(sb, "/home/user/d/b.txt")

    assert {:ok, %Entry{path: "/home/user/d/c.txt"}} =
             Files.rename(sb, "/home/user/d/b.txt", "/home/user/d/c.txt")

    assert {:ok, false} = Files.exists(sb, "/home/user/d/b.txt")
    assert {:ok, true} = Files.exists(sb, "/home/user/d/c.txt")
    assert :ok = Files.remove(sb, "/home/user/d", recursive: true)
    assert {:error, %Cella.Error{reason: :not_found}} = Files.read(sb, "/home/user/d/a.txt")
  end

  test "a watch sees files made, changed, moved and removed", %{sb: sb} do
    Files.make_dir!(sb, "/home/user/w")
    {:ok, watch} = Files.watch(sb, "/home/user/w", recursive: true, timeout: 5)
    # the watch is in place when watch/3 answers
    Cella.Commands.run!(
      sb,
      "cd /home/user/w && echo 1 > a && mv a b && rm b && mkdir sub && echo 2 > sub/c"
    )

    events =
      Enum.take_while(watch, fn e -> not (e.path == "/home/user/w/sub/c" and e.type == :modify) end)

    kinds = Enum.map(events, &{&1.type, &1.path})
    assert {:create, "/home/user/w/a"} in kinds
    assert %FilesystemEvent{from: "/home/user/w/a"} = Enum.find(events, &(&1.type == :rename))
    assert {:delete, "/home/user/w/b"} in kinds
    assert Enum.any?(events, &(&1.type == :create and &1.dir? and &1.path == "/home/user/w/sub"))
  end

  test "a watch with a timeout ends once nothing happens", %{sb: sb} do
    Files.make_dir!(sb, "/home/user/quiet")
    {:ok, watch} = Files.watch(sb, "/home/user/quiet", timeout: 1)
    assert Enum.to_list(watch) == []
  end
end
