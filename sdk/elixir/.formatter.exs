[
  inputs: ["{mix,.formatter}.exs", "{lib,test}/**/*.{ex,exs}", "../../examples/elixir/*.exs"],
  line_length: 100
]
