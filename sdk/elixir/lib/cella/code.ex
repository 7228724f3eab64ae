defmodule Cella.Code do
  @moduledoc """
  The code interpreter: persistent Python and JavaScript kernels in the sandbox. Variables,
  imports and definitions live on between cells of one context.

      {:ok, ex} = Cella.Code.run(sb, "x = 21\\nx * 2")
      ex.result  #=> "42"

  Rich outputs (matplotlib figures, DataFrames as HTML...) come in `outputs`; see
  `Cella.Execution.output/2` and `Cella.Output.bytes/1`.
  """

  import Cella, only: [defbang: 1]
  alias Cella.{HTTP, Error, Execution, KernelInfo, CodeContext}

  @doc """
  Runs a cell. Options: `:language` (`"python"`, the default, or `"javascript"`), `:context`
  (the namespace, default `"default"`), `:timeout` (seconds, at most 300: the cell is
  interrupted, the context survives). A cell that raises is `{:ok, %Cella.Execution{ok: false}}`
  with its `error`.
  """
  @spec run(Cella.Sandbox.t(), String.t(), keyword) :: {:ok, Execution.t()} | {:error, Error.t()}
  def run(sb, code, opts \\ []) do
    body =
      %{code: code, language: opts[:language], context: opts[:context], timeout: opts[:timeout]}
      |> Enum.reject(fn {_, v} -> is_nil(v) end)
      |> Map.new()

    t = min(opts[:timeout] || 300, 300) + 60

    with {:ok, d} <- HTTP.data(sb.config, :post, cpath(sb, ["run"]), json: body, timeout: t) do
      {:ok, Execution.from_map(d)}
    end
  end

  @doc "Which kernels run, their contexts, busy or idle."
  @spec state(Cella.Sandbox.t()) :: {:ok, [KernelInfo.t()]} | {:error, Error.t()}
  def state(sb) do
    with {:ok, d} <- HTTP.data(sb.config, :get, cpath(sb)) do
      {:ok, Cella.Model.list((d || %{})["kernels"], KernelInfo)}
    end
  end

  @doc "The contexts of a language (`language:`, default python)."
  def contexts(sb, opts \\ []) do
    with {:ok, d} <-
           HTTP.data(sb.config, :get, cpath(sb, ["contexts"]), params: [language: opts[:language]]) do
      {:ok, Cella.Model.list(d, CodeContext)}
    end
  end

  @doc "Creates a context (`name:`, `language:`), or answers the one of that name."
  def create_context(sb, opts \\ []) do
    body =
      %{context: opts[:name], language: opts[:language]}
      |> Enum.reject(fn {_, v} -> is_nil(v) end)
      |> Map.new()

    with {:ok, d} <- HTTP.data(sb.config, :post, cpath(sb, ["contexts"]), json: body) do
      {:ok, CodeContext.from_map(d)}
    end
  end

  @doc "Forgets a context's variables: `{:ok, true}` if it existed."
  def reset_context(sb, name, opts \\ []) do
    with {:ok, d} <-
           HTTP.data(sb.config, :delete, cpath(sb, ["contexts", HTTP.seg(name)]),
             params: [language: opts[:language]]
           ) do
      {:ok, (d || %{})["changed"] == true}
    end
  end

  @doc "Ends a language's kernel (`language:`) and every context of it, for a fresh start."
  def reset(sb, opts \\ []) do
    with {:ok, d} <- HTTP.data(sb.config, :delete, cpath(sb), params: [language: opts[:language]]) do
      {:ok, Cella.Model.list((d || %{})["kernels"], KernelInfo)}
    end
  end

  defp cpath(sb, rest \\ []), do: HTTP.sandbox_path(sb.id, ["code" | rest])

  defbang(
    run: [2, 3],
    state: 1,
    contexts: [1, 2],
    create_context: [1, 2],
    reset_context: [2, 3],
    reset: [1, 2]
  )
end
