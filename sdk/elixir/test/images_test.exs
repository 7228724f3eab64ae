defmodule CellaTest.ImagesTest do
  # An image imported from an archive made here: an OCI image layout with one layer.
  use CellaTest.Case

  alias Cella.Image

  defp sha(bin), do: "sha256:" <> (:crypto.hash(:sha256, bin) |> Base.encode16(case: :lower))

  defp tar(entries) do
    path = Path.join(System.tmp_dir!(), "cella-elixir-#{tag()}.tar")

    :ok =
      :erl_tar.create(
        String.to_charlist(path),
        Enum.map(entries, fn {n, b} -> {String.to_charlist(n), b} end)
      )

    data = File.read!(path)
    File.rm!(path)
    data
  end

  defp oci_archive do
    layer = tar([{"etc/elixir-image.txt", "from an imported image\n"}])

    arch =
      if :erlang.system_info(:system_architecture) |> to_string() =~ "aarch64",
        do: "arm64",
        else: "amd64"

    config =
      Cella.JSON.encode!(%{
        architecture: arch,
        os: "linux",
        config: %{},
        rootfs: %{type: "layers", diff_ids: [sha(layer)]}
      })

    manifest =
      Cella.JSON.encode!(%{
        schemaVersion: 2,
        mediaType: "application/vnd.oci.image.manifest.v1+json",
        config: %{
          mediaType: "application/vnd.oci.image.config.v1+json",
          digest: sha(config),
          size: byte_size(config)
        },
        layers: [
          %{
            mediaType: "application/vnd.oci.image.layer.v1.tar",
            digest: sha(layer),
            size: byte_size(layer)
          }
        ]
      })

    index =
      Cella.JSON.encode!(%{
        schemaVersion: 2,
        manifests: [
          %{
            mediaType: "application/vnd.oci.image.manifest.v1+json",
            digest: sha(manifest),
            size: byte_size(manifest)
          }
        ]
      })

    blob = fn b -> {"blobs/sha256/" <> String.replace_prefix(sha(b), "sha256:", ""), b} end

    tar([
      {"oci-layout", ~s({"imageLayoutVersion":"1.0.0"})},
      {"index.json", index},
      blob.(config),
      blob.(manifest),
      blob.(layer)
    ])
  end

  test "an image imported from an OCI archive, listed, deleted; a non-image is refused" do
    name = "elixir-" <> tag()

    assert {:ok, %Image{id: id, name: ^name, digest: "sha256:" <> _}} =
             Image.import_image(oci_archive(), name)

    assert {:ok, images} = Image.list()
    assert Enum.any?(images, &(&1.id == id))
    assert {:ok, %Image{id: ^id}} = Image.delete(id)
    assert {:ok, images} = Image.list()
    refute Enum.any?(images, &(&1.id == id))

    assert {:error, %Cella.Error{status: 400, reason: :invalid_request}} =
             Image.import_image("not a tar", name)
  end
end
