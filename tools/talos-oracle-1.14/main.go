// Command talos-oracle-1.14: Talos's own code (pkg/machinery) checking what Ichor renders for
// contract 1.14. See tools/talos-oracle-core for the commands.
package main

import (
	"context"

	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/cel"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"

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

// runtimeValidate is what machined v1.14.1 runs in ApplyConfiguration: ValidateAtRuntime with
// no options.
func runtimeValidate(ctx context.Context, cfg config.Provider, st state.State, mode validation.RuntimeMode) ([]string, error) {
	return cfg.ValidateAtRuntime(ctx, st, mode)
}

// unattendedSelector is the disk selector the unattended-install controller matches.
func unattendedSelector(cfg config.Provider) *cel.Expression {
	doc := cfg.UnattendedInstallConfig()
	if doc == nil {
		return nil
	}

	expr := doc.VolumeSelector()

	return &expr
}

func main() {
	oracle.Main(contractVersion, oracle.Hooks{
		ValidateBundle:     validateBundle,
		RuntimeValidate:    runtimeValidate,
		UnattendedSelector: unattendedSelector,
	})
}
