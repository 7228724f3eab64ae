defmodule Cella.Snapshot do
  @moduledoc """
  A snapshot of a sandbox's files (`Cella.Sandbox.create_snapshot/2`), from which
  `Cella.Sandbox.create(snapshot_id: id)` starts new sandboxes. `memory` says whether it holds
  the sandbox's memory and processes too (a gVisor checkpoint): sandboxes made from it continue
  where the sandbox was.
  """
  import Cella, only: [defbang: 1]
  alias Cella.HTTP

  use Cella.Model, [:id, :sandbox_id, :template_id, :size, :created_at, :size_bytes, memory: false]

  @doc "The workspace's snapshots, newest first (`limit:`)."
  def list(opts \\ []) do
    {c, o} = Cella.split_opts(opts)
    Cella.pages(c, "/snapshots", [], o[:limit], __MODULE__)
  end

  @doc "One snapshot."
  def get(id, opts \\ []) do
    {c, _} = Cella.split_opts(opts)
    with {:ok, d} <- HTTP.data(c, :get, "/snapshots/" <> HTTP.seg(id)), do: {:ok, from_map(d)}
  end

  @doc "Deletes a snapshot (sandboxes made from it keep their own copy)."
  def delete(id, opts \\ []) do
    {c, _} = Cella.split_opts(opts)
    with {:ok, d} <- HTTP.data(c, :delete, "/snapshots/" <> HTTP.seg(id)), do: {:ok, from_map(d)}
  end

  defbang(list: [0, 1], get: [1, 2], delete: [1, 2])
end

defmodule Cella.Artifact do
  @moduledoc """
  A file kept from a sandbox (by a one-shot run's `artifacts:` or
  `Cella.Sandbox.collect_artifacts/2`); it outlives the sandbox until it expires.
  """
  import Cella, only: [defbang: 1]
  alias Cella.HTTP

  use Cella.Model, [:id, :sandbox_id, :path, :size, :url, :created_at, :expires_at]

  defp ref(%__MODULE__{id: id}), do: id
  defp ref(id) when is_binary(id), do: id

  @doc "The workspace's artifacts, newest first (`sandbox_id:` narrows them; `limit:`)."
  def list(opts \\ []) do
    {c, o} = Cella.split_opts(opts)
    Cella.pages(c, "/artifacts", [sandbox_id: o[:sandbox_id]], o[:limit], __MODULE__)
  end

  @doc "An artifact's bytes (an artifact or its id)."
  def download(artifact, opts \\ []) do
    {c, _} = Cella.split_opts(opts)

    with {:ok, r} <-
           HTTP.request(c, :get, "/artifacts/" <> HTTP.seg(ref(artifact)),
             timeout: c.request_timeout + 600
           ) do
      {:ok, r.body}
    end
  end

  @doc "An artifact's bytes as a stream of binaries, read as they come."
  def download_stream(artifact, opts \\ []) do
    {c, _} = Cella.split_opts(opts)
    Cella.Files.byte_stream(c, "/artifacts/" <> HTTP.seg(ref(artifact)), [])
  end

  @doc "Deletes an artifact now."
  def delete(artifact, opts \\ []) do
    {c, _} = Cella.split_opts(opts)

    with {:ok, d} <- HTTP.data(c, :delete, "/artifacts/" <> HTTP.seg(ref(artifact))) do
      {:ok, from_map(d)}
    end
  end

  defbang(
    list: [0, 1],
    download: [1, 2],
    download_stream: [1, 2],
    delete: [1, 2]
  )
end

defmodule Cella.Template do
  @moduledoc """
  Templates: the catalog (`list/1`, `get/2`) and custom templates built from a base and
  ordered steps (`build/2`, then `wait_build/3`).

      {:ok, build} = Cella.Template.build(%{id: "py-tools", from: "base",
                                            steps: [%{run: "pip install rich"}]})
      {:ok, build} = Cella.Template.wait_build(build, check: true)
      {:ok, sb} = Cella.Sandbox.create(template: "py-tools")
  """
  import Cella, only: [defbang: 1]
  alias Cella.{HTTP, Error, TemplateBuild}

  use Cella.Model, [
    :id,
    :name,
    :default_size,
    :readiness,
    :product,
    :primitive,
    # the names the SDKs and the CLI know it by
    :sdk_name,
    :cli_name,
    :custom,
    :created_at,
    sizes: [],
    # the runtimes its sandboxes can run on on this server, its default first
    runtimes: []
  ]

  @doc "The catalog of templates, with their sizes, readiness and runtimes."
  def list(opts \\ []) do
    {c, _} = Cella.split_opts(opts)
    with {:ok, d} <- HTTP.data(c, :get, "/templates"), do: {:ok, Cella.Model.list(d, __MODULE__)}
  end

  @doc "One template."
  def get(id, opts \\ []) do
    {c, _} = Cella.split_opts(opts)
    with {:ok, d} <- HTTP.data(c, :get, "/templates/" <> HTTP.seg(id)), do: {:ok, from_map(d)}
  end

  @doc """
  Starts a build of a custom template from its spec (a map: `id`, `from`, `steps`, ...; see
  the API's "Custom templates"): `{:ok, %Cella.TemplateBuild{}}`, queued.
  """
  def build(spec, opts \\ []) do
    {c, _} = Cella.split_opts(opts)

    with {:ok, d} <- HTTP.data(c, :post, "/templates", json: spec) do
      {:ok, %{build_of(d) | config: c}}
    end
  end

  # The answer of a build's start: the build, or the template with its build inside.
  defp build_of(%{"build" => %{} = b} = d),
    do: TemplateBuild.from_map(Map.put_new(b, "template_id", d["id"] || d["template_id"]))

  defp build_of(d), do: TemplateBuild.from_map(d)

  @doc "A custom template's builds, newest first (without their logs)."
  def builds(id, opts \\ []) do
    {c, _} = Cella.split_opts(opts)

    with {:ok, d} <- HTTP.data(c, :get, "/templates/" <> HTTP.seg(id) <> "/builds") do
      {:ok, Cella.Model.list(d, TemplateBuild)}
    end
  end

  @doc "A build's state, steps and log (`log_offset:` only the log after that byte)."
  def get_build(id, build_id, opts \\ []) do
    {c, o} = Cella.split_opts(opts)
    path = "/templates/" <> HTTP.seg(id) <> "/builds/" <> HTTP.seg(build_id)

    with {:ok, d} <- HTTP.data(c, :get, path, params: [log_offset: o[:log_offset]]) do
      {:ok, %{TemplateBuild.from_map(d) | config: c}}
    end
  end

  @doc """
  Polls a build until it ends (`ready` or `failed`) and answers it with its
  whole log. `on_log:` gets each new piece of the log; `timeout:` seconds (default 1800);
  `check: true` makes a failed build an error `BUILD_FAILED`.
  """
  def wait_build(%TemplateBuild{} = b, opts \\ []) do
    c = b.config || Cella.Config.resolve(Keyword.take(opts, Cella.Config.keys()))
    deadline = System.monotonic_time(:millisecond) + round((opts[:timeout] || 1800) * 1000)
    poll_build(c, b.template_id, b.id, 0, "", deadline, opts)
  end

  defp poll_build(c, tid, bid, offset, log, deadline, opts) do
    with {:ok, b} <- get_build(tid, bid, config: c, log_offset: offset) do
      if b.log != "" && opts[:on_log], do: opts[:on_log].(b.log)
      log = log <> b.log
      offset = (b.log_offset || 0) + byte_size(b.log)

      cond do
        b.state in ["ready", "failed"] ->
          b = %{b | log: log, log_offset: 0}

          if opts[:check] && b.state != "ready",
            do:
              {:error,
               Error.new("BUILD_FAILED", "build #{bid} of template #{tid} #{b.state}: #{b.error}",
                 details: %{"template_id" => tid, "build_id" => bid}
               )},
            else: {:ok, b}

        System.monotonic_time(:millisecond) > deadline ->
          {:error, Error.new("TIMEOUT", "build #{bid} of template #{tid} did not end in time")}

        true ->
          Process.sleep(opts[:interval] || 250)
          poll_build(c, tid, bid, offset, log, deadline, opts)
      end
    end
  end

  @doc "Deletes a custom template (409 while sandboxes or snapshots use it)."
  def delete(id, opts \\ []) do
    {c, _} = Cella.split_opts(opts)
    with {:ok, d} <- HTTP.data(c, :delete, "/templates/" <> HTTP.seg(id)), do: {:ok, from_map(d)}
  end

  defbang(
    list: [0, 1],
    get: [1, 2],
    build: [1, 2],
    builds: [1, 2],
    get_build: [2, 3],
    wait_build: [1, 2],
    delete: [1, 2]
  )
end

defmodule Cella.Image do
  @moduledoc "OCI images imported into the workspace, the `from` of custom templates."
  import Cella, only: [defbang: 1]
  alias Cella.HTTP

  use Cella.Model, [:id, :reference, :name, :digest, :size_bytes, :created_at, :layers]

  @doc "The workspace's imported images, oldest first."
  def list(opts \\ []) do
    {c, _} = Cella.split_opts(opts)
    with {:ok, d} <- HTTP.data(c, :get, "/images"), do: {:ok, Cella.Model.list(d, __MODULE__)}
  end

  @doc "Imports an image from an archive (an OCI layout or a `docker save` tarball, a binary) as `name`."
  def import_image(archive, name, opts \\ []) do
    {c, _} = Cella.split_opts(opts)

    with {:ok, d} <-
           HTTP.data(c, :post, "/images",
             params: [name: name],
             body: archive,
             content_type: "application/x-tar",
             timeout: c.request_timeout + 600
           ) do
      {:ok, from_map(d)}
    end
  end

  @doc "Deletes an imported image."
  def delete(id, opts \\ []) do
    {c, _} = Cella.split_opts(opts)
    with {:ok, d} <- HTTP.data(c, :delete, "/images/" <> HTTP.seg(id)), do: {:ok, from_map(d)}
  end

  defbang(list: [0, 1], import_image: [2, 3], delete: [1, 2])
end
