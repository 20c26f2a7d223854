package main

import "github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"

// contractVersion is the version contract this oracle generates for.
const contractVersion = "v1.13.0"

// validateBundle runs the bundle's own checks.
func validateBundle(bundle *secrets.Bundle) error {
	return bundle.Validate()
}
