module github.com/cella-dev/cella-go

go 1.19
