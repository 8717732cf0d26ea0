// Command worker consumes Ferry's topics and applies each message exactly
// once through the inbox. See `worker help`.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "worker: not built yet; see the worker issue")
	os.Exit(2)
}
