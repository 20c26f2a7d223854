// Command talos-oracle-1.13: Talos's own code (pkg/machinery) checking what Ichor renders for
// contract 1.13. See tools/talos-oracle-core for the commands.
package main

import (
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"

	oracle "ichor.invalid/tools/talos-oracle-core"
)

// contractVersion is the version contract this oracle generates for.
const contractVersion = "v1.13.0"

// validateBundle runs the bundle's own checks.
func validateBundle(bundle *secrets.Bundle) error {
	return bundle.Validate()
}

func main() {
	oracle.Main(contractVersion, validateBundle)
}
