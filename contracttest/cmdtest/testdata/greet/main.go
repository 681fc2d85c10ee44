// Command greet is the program that cmdtest's tests build: it prints
// "hello" and its arguments, and exits with status 0.
package main

import (
	"fmt"
	"os"
	"strings"
)

func main() {
	fmt.Println(strings.Join(append([]string{"hello"}, os.Args[1:]...), " "))
}
