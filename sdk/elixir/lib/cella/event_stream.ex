defmodule Cella.EventStream do
  @moduledoc """
  A live stream from the server (a streamed command's output, a process's output, a file
  watch, a task run's events or log): an `Enumerable`, read lazily with `Enum` and `Stream`
  functions as the server sends it.

  * It is read in the process that opened it (the answer arrives in that process's mailbox),
    and read once.
  * Stopping early (`Enum.take/2`, `Stream.take_while/2`, an exception) closes the
    connection; so does `close/1`, for a stream never read.
  * An error the server sends midway (an `error` event), a stream that ends before its last
    event, or a connection that breaks raises `Cella.Error`.
  """

  alias Cella.{Error, HTTP, JSON, SSE}

  defstruct [:ref, :request_id, :headers, :enum]

  @type t :: %__MODULE__{}

  @doc false
  # Opens the stream now (so a watch is in place when this returns, and 4xx answers come back
  # as errors); `handle.(event, acc)` maps each event to
  # `{:cont, items, acc} | {:halt, items, acc} | {:error, %Cella.Error{}}`, and `at_end.(acc)`
  # says what the end of the answer means: `:ok` or `{:error, e}`.
  def open(config, method, path, opts, acc, handle, at_end) do
    idle = opts[:idle_timeout]
    deadline = opts[:deadline]

    owner = self()

    with {:ok, %{ref: ref} = s} <- HTTP.open_stream(config, method, path, opts) do
      start = fn ->
        if self() != owner,
          do: raise(ArgumentError, "a Cella.EventStream is read by the process that opened it")

        if Process.get({:cella_stream, ref}),
          do: raise(ArgumentError, "a Cella.EventStream is read once")

        Process.put({:cella_stream, ref}, true)
        %{sse: SSE.new(), acc: acc, halted: false, done: false, last: now()}
      end

      next = fn
        %{halted: true} = st ->
          {:halt, st}

        st ->
          wait = wait_ms(idle && idle * 1000 - (now() - st.last), deadline)

          case HTTP.recv(ref, wait) do
            {:data, bin} ->
              {events, sse} = SSE.feed(st.sse, bin)
              # keep-alive comments do not count as events for the idle timeout
              st = if Enum.any?(events, &(&1 != :keepalive)), do: %{st | last: now()}, else: st
              {items, st} = run(events, %{st | sse: sse}, handle, s.request_id)

              if items == [] and not st.halted and idle && now() - st.last >= idle * 1000,
                do: {:halt, st},
                else: {items, st}

            :done ->
              {events, sse} = SSE.flush(st.sse)
              {items, st} = run(events, %{st | sse: sse, done: true}, handle, s.request_id)

              if st.halted do
                {items, st}
              else
                case at_end.(st.acc) do
                  :ok -> {items, %{st | halted: true}}
                  {:error, e} -> raise %{e | request_id: e.request_id || s.request_id}
                end
              end

            {:error, e} ->
              raise e

            :timeout ->
              if deadline && System.monotonic_time(:millisecond) >= deadline do
                raise Error.new("TIMEOUT", "the stream did not end in time",
                        request_id: s.request_id
                      )
              else
                # idle: no event for :idle_timeout seconds ends the stream quietly
                {:halt, st}
              end
          end
      end

      after_fun = fn st ->
        unless st.done, do: HTTP.cancel(ref)
      end

      {:ok,
       %__MODULE__{
         ref: ref,
         request_id: s.request_id,
         headers: s.headers,
         enum: Stream.resource(start, next, after_fun)
       }}
    end
  end

  defp now, do: System.monotonic_time(:millisecond)

  # `idle`: milliseconds left of the idle timeout (or nil); `deadline`: a monotonic time.
  defp wait_ms(idle, deadline) do
    d = deadline && max(deadline - now(), 0)
    i = idle && max(round(idle), 0)

    case {i, d} do
      {nil, nil} -> :infinity
      {i, nil} -> i
      {nil, d} -> d
      {i, d} -> min(i, d)
    end
  end

  defp run(events, st, handle, request_id) do
    Enum.reduce_while(events, {[], st}, fn
      :keepalive, acc ->
        {:cont, acc}

      ev, {items, st} ->
        case handle.(ev, st.acc) do
          {:cont, more, a} -> {:cont, {items ++ more, %{st | acc: a}}}
          {:halt, more, a} -> {:halt, {items ++ more, %{st | acc: a, halted: true}}}
          {:error, e} -> raise %{e | request_id: e.request_id || request_id}
        end
    end)
  end

  @doc "Closes a stream that will not be read (or not to its end)."
  @spec close(t) :: :ok
  def close(%__MODULE__{ref: ref}) do
    HTTP.cancel(ref)
    :ok
  end

  @doc false
  def json(%{data: data}) do
    case JSON.decode(data) do
      {:ok, v} -> v
      {:error, _} -> data
    end
  end

  @doc false
  def error_event(ev) do
    case JSON.decode(ev.data) do
      {:ok, %{} = env} -> Error.from_envelope(env, nil)
      _ -> Error.new("INTERNAL", ev.data || "the stream ended with an error")
    end
  end

  defimpl Enumerable do
    def reduce(%{enum: e}, acc, fun), do: Enumerable.reduce(e, acc, fun)
    def count(_), do: {:error, __MODULE__}
    def member?(_, _), do: {:error, __MODULE__}
    def slice(_), do: {:error, __MODULE__}
  end
end
