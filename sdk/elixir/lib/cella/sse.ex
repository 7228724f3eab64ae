defmodule Cella.SSE do
  @moduledoc """
  An incremental decoder of server-sent events (the subset the Cella server speaks): feed it
  bytes as they come, get back the events they complete.
  """

  defstruct buf: "", event: "", data: []

  @type event :: %{event: String.t(), data: String.t()} | :keepalive
  @type t :: %__MODULE__{}

  def new, do: %__MODULE__{}

  @doc "Feeds bytes; answers the events (and `:keepalive` for comment lines) they complete."
  @spec feed(t, binary) :: {[event], t}
  def feed(%__MODULE__{} = s, bytes) do
    parts = String.split(s.buf <> bytes, "\n")
    {lines, [rest]} = Enum.split(parts, -1)

    {events, s} =
      Enum.reduce(lines, {[], %{s | buf: rest}}, fn line, {acc, st} ->
        case line(st, String.trim_trailing(line, "\r")) do
          {nil, st} -> {acc, st}
          {ev, st} -> {[ev | acc], st}
        end
      end)

    {Enum.reverse(events), s}
  end

  @doc "An event the stream ended in without its blank line."
  @spec flush(t) :: {[event], t}
  def flush(%__MODULE__{} = s) do
    {events, s} = if s.buf != "", do: feed(s, "\n"), else: {[], s}

    case s do
      %{event: "", data: []} -> {events, s}
      _ -> {events ++ [emit(s)], new()}
    end
  end

  defp line(%{event: "", data: []} = s, ""), do: {nil, s}
  defp line(s, ""), do: {emit(s), %{s | event: "", data: []}}
  defp line(s, ":" <> _), do: {:keepalive, s}

  defp line(s, text) do
    {name, value} =
      case String.split(text, ":", parts: 2) do
        [name, " " <> v] -> {name, v}
        [name, v] -> {name, v}
        [name] -> {name, ""}
      end

    case name do
      "event" -> {nil, %{s | event: value}}
      "data" -> {nil, %{s | data: [value | s.data]}}
      _ -> {nil, s}
    end
  end

  defp emit(s),
    do: %{
      event: if(s.event == "", do: "message", else: s.event),
      data: s.data |> Enum.reverse() |> Enum.join("\n")
    }

  @doc "The bytes of a `stdout`/`stderr` event's data: a JSON string, or `{\"b64\": ...}`."
  def output_bytes(text) when is_binary(text), do: text
  def output_bytes(%{"b64" => b64}), do: Base.decode64!(b64)
  def output_bytes(_), do: ""
end
