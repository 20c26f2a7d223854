// Command talosctl is the real talosctl, built from the Talos module at the version go.mod
// requires, so Ichor's tests drive ichor-sim with the client Talos users run.
package main

import (
	"os"

	_ "github.com/siderolabs/talos/cmd/talosctl/acompat"
	"github.com/siderolabs/talos/cmd/talosctl/cmd"
)

func main() {
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
}
