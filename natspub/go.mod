module github.com/stockres/stock/natspub

go 1.25.0

require (
	github.com/nats-io/nats.go v1.52.0
	github.com/stockres/stock v0.0.0-00010101000000-000000000000
	github.com/stockres/stock/sqlstore v0.0.0-00010101000000-000000000000
	github.com/stockres/stock/stocktest v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.9.0
	modernc.org/sqlite v1.59.0
)

require (
	github.com/alicebob/miniredis/v2 v2.40.0 // indirect
	github.com/davecgh/go-spew v1.1.1 // indirect
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/klauspost/compress v1.20.0 // indirect
	github.com/kr/pretty v0.3.0 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	github.com/redis/rueidis v1.0.79 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	golang.org/x/crypto v0.55.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	gopkg.in/check.v1 v1.0.0-20201130134442-10cb98267c6c // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
	modernc.org/libc v1.76.0 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
)

replace github.com/stockres/stock => ..

replace github.com/stockres/stock/stocktest => ../stocktest

replace github.com/stockres/stock/sqlstore => ../sqlstore
