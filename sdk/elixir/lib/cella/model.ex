defmodule Cella.Model do
  @moduledoc false
  # `use Cella.Model, [field: default, ...]` defines the struct (plus `raw`, the map as the
  # server sent it) and `from_map/1`, which takes the fields of that name from a JSON object
  # and turns RFC 3339 times (`*_at`) into `DateTime`s. A module may define `cast/1` to adjust
  # the struct after that.

  defmacro __using__(fields) do
    quote bind_quoted: [fields: fields] do
      fields = Enum.map(fields, fn f -> if is_atom(f), do: {f, nil}, else: f end)
      @cella_fields Keyword.keys(fields)
      @derive {Inspect, except: [:raw | Enum.filter([:config], &(&1 in @cella_fields))]}
      defstruct fields ++ [raw: %{}]

      @doc false
      def from_map(nil), do: nil

      def from_map(%{} = map) do
        base =
          Enum.reduce(@cella_fields, struct(__MODULE__, raw: map), fn f, acc ->
            key = Atom.to_string(f)

            case Map.fetch(map, key) do
              {:ok, v} -> Map.put(acc, f, Cella.Model.value(key, v))
              :error -> acc
            end
          end)

        cast(base)
      end

      @doc false
      def cast(s), do: s
      defoverridable cast: 1
    end
  end

  @doc false
  def value(key, v) when is_binary(v) do
    if String.ends_with?(key, "_at") do
      case DateTime.from_iso8601(v) do
        {:ok, t, _} -> t
        _ -> v
      end
    else
      v
    end
  end

  def value(_, v), do: v

  @doc false
  def list(nil, _mod), do: []
  def list(items, mod) when is_list(items), do: Enum.map(items, &mod.from_map/1)
end

defmodule Cella.NetworkPolicy do
  @moduledoc "A sandbox's egress policy: `egress` `\"allow\"` or `\"deny\"`, and `allow`/`deny` lists."
  use Cella.Model, egress: "allow", allow: [], deny: []
end

defmodule Cella.SandboxUsage do
  @moduledoc "A sandbox's usage: running, paused and billed seconds, CPU seconds, memory MiB-seconds."
  use Cella.Model, [
    :sandbox_id,
    :state,
    :running_sec,
    :paused_sec,
    :billed_sec,
    :cpu_sec,
    :memory_mib_sec,
    :memory_mib_now,
    :measured_at
  ]
end

defmodule Cella.ExposedPort do
  @moduledoc """
  The addresses of a port inside a sandbox, through the server's preview proxy. `url` is the
  one programs open; `host_url` the port's own origin; `token` the preview token when the
  sandbox's previews need one.
  """
  use Cella.Model, [:port, :url, :path_url, :host_url, :token, :token_expires_at]
end

defmodule Cella.PreviewToken do
  @moduledoc "A sandbox's preview token (`POST .../preview-token`)."
  use Cella.Model, [:token, :expires_at, :sandbox_id]
end

defmodule Cella.CommandResult do
  @moduledoc "The end of a command: exit code, output (text), duration, whether it timed out."
  use Cella.Model,
    exit_code: -1,
    stdout: "",
    stderr: "",
    duration_ms: 0,
    timed_out: false,
    stdout_truncated: false,
    stderr_truncated: false

  @doc "True when the command exited 0."
  def ok?(%__MODULE__{exit_code: code}), do: code == 0
end

defmodule Cella.ProcessInfo do
  @moduledoc "A background process: pid, argv, `state` (`running`/`exited`), exit code, tag."
  use Cella.Model, [
    :pid,
    :argv,
    :state,
    :user,
    :cwd,
    :tag,
    :exit_code,
    :started_at,
    :ended_at,
    output_dropped_bytes: 0
  ]
end

defmodule Cella.OutputChunk do
  @moduledoc "A piece of a command's output: `stream` is `:stdout` or `:stderr`, `data` its bytes."
  defstruct [:stream, :data]
  @type t :: %__MODULE__{stream: :stdout | :stderr, data: binary}
end

defmodule Cella.Entry do
  @moduledoc "A file, directory or link inside a sandbox (`type`: `\"file\"`, `\"dir\"`, `\"symlink\"`)."
  use Cella.Model, [:name, :path, :type, :size, :mode, :modified_at, :uid, :gid, :symlink_target]
end

defmodule Cella.FilesystemEvent do
  @moduledoc """
  A change seen by a file watch: `type` `:create`, `:modify`, `:delete` or `:rename`, its
  `path`, `dir?`, and `from` (a rename's old path).
  """
  defstruct [:type, :path, :from, dir?: false]
end

defmodule Cella.Output do
  @moduledoc "A rich output of a code cell: `mime` and `data` (text, or base64 for binary types)."
  use Cella.Model, [:mime, :data]

  @doc "The bytes of a binary output (`image/png`...), decoded from base64; text as it is."
  def bytes(%__MODULE__{mime: mime, data: data}) do
    if String.starts_with?(mime || "", "text/") or mime in ["application/json", "image/svg+xml"],
      do: data,
      else: Base.decode64!(data)
  end
end

defmodule Cella.ExecutionError do
  @moduledoc "How a code cell failed: the exception's `name`, `value` and `traceback`."
  use Cella.Model, [:name, :value, traceback: ""]
end

defmodule Cella.Execution do
  @moduledoc """
  A code cell's answer: `ok`, `stdout`, `stderr`, `result` (the last expression, as the REPL
  shows it), `error` (`Cella.ExecutionError`), `outputs` (`Cella.Output`s: images, HTML...),
  and `restarted` (the kernel was restarted and the language's contexts lost).
  """
  use Cella.Model,
    ok: false,
    stdout: "",
    stderr: "",
    result: nil,
    language: "python",
    error: nil,
    outputs: [],
    restarted: false

  def cast(s) do
    %{
      s
      | error: Cella.ExecutionError.from_map(s.error),
        outputs: Cella.Model.list(s.outputs, Cella.Output),
        restarted: s.restarted == true
    }
  end

  @doc "The first output of a MIME type (`\"image/png\"`), or nil."
  def output(%__MODULE__{outputs: outs}, mime), do: Enum.find(outs, &(&1.mime == mime))
end

defmodule Cella.CodeContext do
  @moduledoc "A code interpreter context: its `name` and `language`."
  use Cella.Model, [:name, :language]
end

defmodule Cella.KernelInfo do
  @moduledoc "A code interpreter's kernel: `language`, `running`, `busy`, `contexts`."
  use Cella.Model, [:language, running: false, busy: false, contexts: []]
end

defmodule Cella.RunResult do
  @moduledoc """
  A one-shot run's answer: the command's exit code and output, and the `artifacts`
  (`Cella.Artifact`s) kept from its sandbox, which is gone.
  """
  use Cella.Model,
    exit_code: -1,
    stdout: "",
    stderr: "",
    duration_ms: 0,
    timed_out: false,
    sandbox_id: nil,
    artifacts: []

  def cast(s), do: %{s | artifacts: Cella.Model.list(s.artifacts, Cella.Artifact)}

  def ok?(%__MODULE__{exit_code: c}), do: c == 0
end

defmodule Cella.BuildStep do
  @moduledoc "A step of a template build: `index`, `kind`, `state`, `duration_ms`."
  use Cella.Model, [:index, :kind, :state, :duration_ms]
end

defmodule Cella.TemplateBuild do
  @moduledoc """
  A build of a custom template: `state` (`queued`, `building`, `ready`, `failed`),
  `steps`, the `log` (from `log_offset`), `error`.
  """
  use Cella.Model, [
    :id,
    :template_id,
    :state,
    :error,
    :created_at,
    :finished_at,
    steps: [],
    log: "",
    log_offset: 0,
    config: nil
  ]

  def cast(s), do: %{s | steps: Cella.Model.list(s.steps, Cella.BuildStep), log: s.log || ""}
end

defmodule Cella.TaskEvent do
  @moduledoc """
  An event of a task run (`Cella.Task.events/2`): `type` `:state` (with `state`, `at`,
  `failure_reason`, `stop_reason`) or `:progress` (with `steps`, `commits`, `files_changed`).
  """
  use Cella.Model, [
    :type,
    :state,
    :at,
    :failure_reason,
    :stop_reason,
    :steps,
    :commits,
    :files_changed
  ]
end

defmodule Cella.LogChunk do
  @moduledoc "A piece of a task run's live log: `stream` (`\"stdout\"`/`\"stderr\"`) and `text`."
  use Cella.Model, [:stream, :text]
end

defmodule Cella.Wallet do
  @moduledoc "A workspace's wallet: `balance`, `reserved`, `available` (decimal strings), `currency`."
  use Cella.Model, [:balance, :reserved, :available, :currency]
end

defmodule Cella.LedgerEntry do
  @moduledoc """
  An entry of a workspace's ledger: `kind` (`credit`, `compute`, `model`, `refund`), `amount`
  and `balance_after` (decimal strings), and what it is for (`sandbox_id`, `task_id`...).
  """
  use Cella.Model, [
    :id,
    :at,
    :kind,
    :amount,
    :balance_after,
    :sandbox_id,
    :task_id,
    :reference,
    :compute_sec,
    :compute_rate,
    :model,
    :input_tokens,
    :output_tokens
  ]
end

defmodule Cella.WorkspaceUsage do
  @moduledoc "A workspace's usage per UTC day (`days`, maps) and its `totals`, in `[from, to)`."
  use Cella.Model, [:from, :to, :currency, days: [], totals: %{}]
end

defmodule Cella.Storage do
  @moduledoc "What a workspace stores against its storage quota, in bytes."
  use Cella.Model, [
    :used_bytes,
    :quota_bytes,
    :snapshots_bytes,
    :artifacts_bytes,
    :images_bytes,
    :templates_bytes
  ]
end
