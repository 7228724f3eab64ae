module github.com/cella-dev/cella-go/examples

go 1.19

require github.com/cella-dev/cella-go v0.0.0

replace github.com/cella-dev/cella-go => ../../sdk/go
