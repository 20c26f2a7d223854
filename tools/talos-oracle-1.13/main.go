// Command talos-oracle-1.13: Talos's own code (pkg/machinery) checking what Ichor renders for
// contract 1.13. See tools/talos-oracle-core for the commands.
package main

import (
	"context"
	"slices"

	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"

	oracle "ichor.invalid/tools/talos-oracle-core"
)

// contractVersion is the version contract this oracle generates for.
const contractVersion = "v1.13.0"

// validateBundle runs the bundle's own checks.
func validateBundle(bundle *secrets.Bundle) error {
	return bundle.Validate()
}

// runtimeValidate is what machined v1.13.9 runs in ApplyConfiguration: Validate with no
// options, then RuntimeValidate, each refusal answered on its own.
func runtimeValidate(ctx context.Context, cfg config.Provider, st state.State, mode validation.RuntimeMode) ([]string, error) {
	warnings, err := cfg.Validate(mode)
	if err != nil {
		return nil, err
	}

	runtimeWarnings, err := cfg.RuntimeValidate(ctx, st, mode)
	if err != nil {
		return nil, err
	}

	return slices.Concat(warnings, runtimeWarnings), nil
}

func main() {
	oracle.Main(contractVersion, oracle.Hooks{
		ValidateBundle:  validateBundle,
		RuntimeValidate: runtimeValidate,
	})
}
