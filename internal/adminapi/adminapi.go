// Package adminapi holds the names the daemon's admin HTTP API and its
// clients (the ingestor subcommands) share, so that a client needs no
// import of the daemon itself.
package adminapi

// TotalCountHeader is the response header of GET /dlq giving how many dead
// letters the filter selects in all, beyond the page returned.
const TotalCountHeader = "X-Total-Count"
