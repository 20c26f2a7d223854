// Command talos-oracle-1.14: Talos's own code (pkg/machinery) checking what Ichor renders for
// contract 1.14. See tools/talos-oracle-core for the commands.
package main

import (
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	oracle "ichor.invalid/tools/talos-oracle-core"
)

// contractVersion is the version contract this oracle generates for.
const contractVersion = "v1.14.0"

// validateBundle runs the bundle's own checks (1.14 takes the contract).
func validateBundle(bundle *secrets.Bundle) error {
	contract, err := config.ParseContractFromVersion(contractVersion)
	if err != nil {
		return err
	}

	return bundle.Validate(contract)
}

func main() {
	oracle.Main(contractVersion, validateBundle)
}
