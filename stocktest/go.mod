module github.com/stockres/stock/stocktest

go 1.25.0

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/redis/rueidis v1.0.79
	github.com/stockres/stock v0.0.0-00010101000000-000000000000
)

require (
	github.com/yuin/gopher-lua v1.1.1 // indirect
	golang.org/x/sys v0.47.0 // indirect
)

replace github.com/stockres/stock => ..
