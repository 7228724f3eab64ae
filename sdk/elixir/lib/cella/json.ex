defmodule Cella.JSON do
  @moduledoc """
  JSON through jiffy (Debian's `erlang-jiffy`): objects decode to maps with string keys,
  `null` to `nil`; `nil` encodes as `null`, atoms as strings.
  """

  @spec decode(binary) :: {:ok, term} | {:error, Cella.Error.t()}
  def decode(""), do: {:ok, nil}

  def decode(text) when is_binary(text) do
    {:ok, :jiffy.decode(text, [:return_maps, :use_nil])}
  rescue
    e ->
      {:error, Cella.Error.new("DECODE_ERROR", "the answer is not JSON: #{Exception.message(e)}")}
  catch
    kind, why ->
      {:error, Cella.Error.new("DECODE_ERROR", "the answer is not JSON: #{inspect({kind, why})}")}
  end

  @spec decode!(binary) :: term
  def decode!(text) do
    case decode(text) do
      {:ok, v} -> v
      {:error, e} -> raise e
    end
  end

  @spec encode!(term) :: binary
  def encode!(term), do: term |> prepare() |> :jiffy.encode([:use_nil]) |> IO.iodata_to_binary()

  # jiffy takes maps, lists, binaries, numbers, true/false/nil and atoms; turn what it does not
  # know (structs, tuples of pairs) into what it does.
  defp prepare(%DateTime{} = t), do: DateTime.to_iso8601(t)
  defp prepare(%_{} = s), do: s |> Map.from_struct() |> prepare()

  defp prepare(%{} = m),
    do: Map.new(m, fn {k, v} -> {if(is_atom(k), do: Atom.to_string(k), else: k), prepare(v)} end)

  defp prepare(l) when is_list(l), do: Enum.map(l, &prepare/1)
  defp prepare(other), do: other
end
