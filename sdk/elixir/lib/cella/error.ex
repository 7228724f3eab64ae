defmodule Cella.Error do
  @moduledoc """
  Every error the SDK answers (`{:error, %Cella.Error{}}`) or raises (the `!` variants, and
  streams that fail midway).

  * `code` - the server's error code (`"NOT_FOUND"`, `"SANDBOX_NOT_RUNNING"`, ...), or one of
    this SDK's own for failures that never reached an answer: `"TIMEOUT"`,
    `"CONNECTION_ERROR"`, `"STREAM_ENDED"`, `"COMMAND_EXIT"`, `"BUILD_FAILED"`.
  * `reason` - the same as an atom, to match on: `:not_found`, `:unauthorized`, `:forbidden`,
    `:conflict`, `:sandbox_not_running`, `:payload_too_large`, `:rate_limited`,
    `:concurrency_limit`, `:invalid_request`, `:timeout`, `:connection_error`, ...
    (`:unknown` for a code this SDK does not know).
  * `status` - the HTTP status (`nil` when there was no answer).
  * `details` - the envelope's `details` (a map, or `nil`).
  * `request_id` - the answer's `x-request-id`, which the server's log is keyed on.
  * `retry_after` - seconds, from a 429's `Retry-After`.

      case Cella.Sandbox.connect("sb...") do
        {:ok, sandbox} -> sandbox
        {:error, %Cella.Error{reason: :not_found}} -> nil
      end
  """

  defexception [:code, :reason, :message, :status, :details, :request_id, :retry_after]

  @type t :: %__MODULE__{
          code: String.t() | nil,
          reason: atom,
          message: String.t(),
          status: non_neg_integer | nil,
          details: map | nil,
          request_id: String.t() | nil,
          retry_after: number | nil
        }

  @by_status %{
    400 => "INVALID_REQUEST",
    401 => "UNAUTHORIZED",
    402 => "INSUFFICIENT_FUNDS",
    403 => "FORBIDDEN",
    404 => "NOT_FOUND",
    405 => "METHOD_NOT_ALLOWED",
    408 => "REQUEST_TIMEOUT",
    409 => "CONFLICT",
    410 => "GONE",
    413 => "PAYLOAD_TOO_LARGE",
    416 => "RANGE_NOT_SATISFIABLE",
    429 => "RATE_LIMITED",
    500 => "INTERNAL",
    503 => "UNAVAILABLE",
    507 => "INSUFFICIENT_STORAGE"
  }

  @known ~w(INVALID_REQUEST UNKNOWN_LANGUAGE SIZE_UNAVAILABLE UNAUTHORIZED INSUFFICIENT_FUNDS
            FORBIDDEN NOT_FOUND METHOD_NOT_ALLOWED REQUEST_TIMEOUT CONFLICT SANDBOX_NOT_RUNNING GONE
            PAYLOAD_TOO_LARGE RANGE_NOT_SATISFIABLE RATE_LIMITED CONCURRENCY_LIMIT INTERNAL
            UNAVAILABLE INSUFFICIENT_STORAGE TIMEOUT CONNECTION_ERROR STREAM_ENDED COMMAND_EXIT
            BUILD_FAILED DECODE_ERROR)

  @reasons Map.new(@known, fn code -> {code, code |> String.downcase() |> String.to_atom()} end)

  @doc "The atom for an error code (`:unknown` for a code this SDK does not know)."
  @spec reason_of(String.t() | nil) :: atom
  def reason_of(code), do: Map.get(@reasons, code, :unknown)

  @doc "An error of this SDK's own (no answer from the server)."
  @spec new(String.t(), String.t(), keyword) :: t
  def new(code, message, fields \\ []) do
    struct!(%__MODULE__{code: code, reason: reason_of(code), message: message}, fields)
  end

  @doc """
  The error for an error envelope (`%{"error" => %{"code", "message", "details"}}`, or the
  inner map), with the HTTP status when there was one.
  """
  @spec from_envelope(term, non_neg_integer | nil, keyword) :: t
  def from_envelope(envelope, status, fields \\ []) do
    inner =
      case envelope do
        %{"error" => %{} = e} -> e
        %{"code" => _} = e -> e
        _ -> nil
      end

    case inner do
      nil ->
        fallback(status, inspect(envelope), fields)

      e ->
        code = if is_binary(e["code"]), do: e["code"], else: Map.get(@by_status, status)
        message = if is_binary(e["message"]), do: e["message"], else: code || "error"
        new(code, message, [status: status, details: e["details"]] ++ fields)
    end
  end

  @doc "The error for an HTTP error answer's body (a JSON envelope or anything else)."
  @spec from_body(non_neg_integer, binary, keyword) :: t
  def from_body(status, body, fields \\ []) do
    case Cella.JSON.decode(body) do
      {:ok, %{"error" => %{}} = env} ->
        from_envelope(env, status, fields)

      _ ->
        text = body |> String.slice(0, 500) |> String.trim()
        fallback(status, if(text == "", do: "HTTP #{status}", else: text), fields)
    end
  end

  defp fallback(status, message, fields) do
    code = Map.get(@by_status, status, if(status, do: "HTTP_#{status}"))
    new(code, message, [status: status] ++ fields)
  end

  @impl true
  def message(%__MODULE__{} = e) do
    extra =
      [e.status && "HTTP #{e.status}", e.request_id && "request #{e.request_id}"]
      |> Enum.filter(& &1)

    base = if e.code, do: "#{e.code}: #{e.message}", else: e.message || "error"
    if extra == [], do: base, else: base <> " (" <> Enum.join(extra, ", ") <> ")"
  end

  @doc "`details.field` when the server named the field at fault."
  @spec field(t) :: String.t() | nil
  def field(%__MODULE__{details: %{"field" => f}}) when is_binary(f), do: f
  def field(_), do: nil
end
