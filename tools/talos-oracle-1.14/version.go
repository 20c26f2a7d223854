package main

import (
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
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
