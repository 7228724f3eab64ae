defmodule Cella.MixProject do
  use Mix.Project

  @version "0.1.0"

  # JSON comes from jiffy, which Debian packages as `erlang-jiffy` into OTP's own library
  # directory (so it is on the code path already). Elsewhere, point ERL_LIBS at the directory
  # that holds `jiffy-*/`; this adds the first jiffy found under OTP's lib dir otherwise.
  unless match?({:file, _}, :code.is_loaded(:jiffy)) or :code.which(:jiffy) != :non_existing do
    for ebin <- Path.wildcard(Path.join(:code.lib_dir(), "jiffy-*/ebin")) |> Enum.take(-1) do
      Code.prepend_path(ebin)
    end
  end

  def project do
    [
      app: :cella,
      version: @version,
      elixir: "~> 1.14",
      start_permanent: false,
      deps: [],
      elixirc_paths: ["lib"],
      description: "Client for the Cella sandbox platform's API",
      docs: [main: "readme", extras: ["README.md"]]
    ]
  end

  def application do
    [extra_applications: [:logger, :inets, :ssl, :crypto, :public_key, :jiffy]]
  end
end
