// Command hello prints its arguments and exits with status 3; procs's Build
// test compiles and runs it.
package main

import (
	"fmt"
	"os"
	"strings"
)

func main() {
	fmt.Println("hello", strings.Join(os.Args[1:], " "), os.Getenv("HELLO_ENV"))
	os.Exit(3)
}
