package oracle

// The apply command: what machined checks when a config is applied (ApplyConfiguration in
// internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go of each Talos release),
// against the disks of a simulated machine.
//
// Why a command of its own rather than `validate`: `validate` is what talosctl checks on the
// client (strict, local). machined checks differently:
//   - no options: not strict (warnings stay warnings) and not local (1.13 checks the Kubernetes
//     image versions against the running Talos version);
//   - the mode is the platform's (metal) with RequiresInstall false once the machine is
//     installed (machined's modeWrapper);
//   - runtime checks against the machine's resources: a .machine.install.diskSelector must
//     match one of its disks;
//   - outside maintenance a config without a v1alpha1 document is refused.
//
// Request (JSON on stdin):
//
//	{"config": "<multi-document YAML>", "maintenance": true, "installed": false,
//	 "disks": [{"id": "vda", "devPath": "/dev/vda", "size": 100000000000, "cdrom": false,
//	            "readonly": false, "rotational": false, "transport": "virtio",
//	            "model": "", "serial": "", "wwid": "", "busPath": ""}]}
//
// Result: ok, the InvalidArgument message machined would answer (error), the warnings it
// would return, and, when the config installs, where Talos would install (install).

import (
	"context"
	"encoding/json"

	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/siderolabs/talos/pkg/machinery/cel"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/config/types/block/blockhelpers"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
)

// RuntimeValidator runs the validation machined runs on an applied config; the call differs
// between machinery minors (1.13: Validate then RuntimeValidate, 1.14: ValidateAtRuntime).
type RuntimeValidator func(ctx context.Context, cfg config.Provider, st state.State, mode validation.RuntimeMode) ([]string, error)

// Hooks are the parts of the oracle whose machinery API differs between minors.
type Hooks struct {
	// ValidateBundle runs the bundle's own checks.
	ValidateBundle func(*secrets.Bundle) error
	// RuntimeValidate runs machined's apply-time validation.
	RuntimeValidate RuntimeValidator
	// UnattendedSelector returns the disk selector of the config's UnattendedInstallConfig
	// document (1.14 and later), or nil.
	UnattendedSelector func(config.Provider) *cel.Expression
}

var (
	runtimeValidate    RuntimeValidator
	unattendedSelector func(config.Provider) *cel.Expression
)

type simDisk struct {
	ID         string `json:"id"`
	DevPath    string `json:"devPath"`
	Size       uint64 `json:"size"`
	CDROM      bool   `json:"cdrom"`
	Readonly   bool   `json:"readonly"`
	Rotational bool   `json:"rotational"`
	Transport  string `json:"transport"`
	Model      string `json:"model"`
	Serial     string `json:"serial"`
	WWID       string `json:"wwid"`
	BusPath    string `json:"busPath"`
}

type applyRequest struct {
	Config      string    `json:"config"`
	Maintenance bool      `json:"maintenance"`
	Installed   bool      `json:"installed"`
	Disks       []simDisk `json:"disks"`
}

// installPlan is where Talos would install: the install sequence (.machine.install) or the
// unattended-install controller (UnattendedInstallConfig).
type installPlan struct {
	Source string `json:"source"`
	// Expression is the disk selector as CEL, if the config selects the disk by one.
	Expression string `json:"expression,omitempty"`
	// Matched are the disks the selector matches, in the order Talos lists them.
	Matched []string `json:"matched"`
	// Disk is the disk Talos installs to: the first match, or the configured path.
	Disk string `json:"disk,omitempty"`
}

// mode is machined's modeWrapper around the metal platform mode: an installed machine does
// not require an install.
type mode struct{ installed bool }

func (mode) String() string          { return "metal" }
func (m mode) RequiresInstall() bool { return !m.installed }
func (mode) InContainer() bool       { return false }

func diskState(ctx context.Context, disks []simDisk) (state.State, error) {
	st := state.WrapCore(namespaced.NewState(inmem.Build))

	for _, d := range disks {
		disk := block.NewDisk(block.NamespaceName, d.ID)
		spec := disk.TypedSpec()
		spec.DevPath = d.DevPath
		spec.SetSize(d.Size)
		spec.CDROM = d.CDROM
		spec.Readonly = d.Readonly
		spec.Rotational = d.Rotational
		spec.Transport = d.Transport
		spec.Model = d.Model
		spec.Serial = d.Serial
		spec.WWID = d.WWID
		spec.BusPath = d.BusPath

		if err := st.Create(ctx, disk); err != nil {
			return nil, err
		}
	}

	return st, nil
}

func apply(input []byte) result {
	var req applyRequest
	if err := json.Unmarshal(input, &req); err != nil {
		fail(err)
	}

	ctx := context.Background()

	st, err := diskState(ctx, req.Disks)
	if err != nil {
		fail(err)
	}

	cfg, err := configloader.NewFromBytes([]byte(req.Config))
	if err != nil {
		return result{Error: err.Error()}
	}

	if !req.Maintenance && cfg.RawV1Alpha1() == nil {
		return result{Error: "the applied machine configuration doesn't contain v1alpha1 config, did you mean to patch the machine config instead?"}
	}

	warnings, err := runtimeValidate(ctx, cfg, st, mode{installed: req.Installed})
	if err != nil {
		return result{Error: err.Error(), Warnings: warnings}
	}

	plan, err := planInstall(ctx, cfg, st)
	if err != nil {
		fail(err)
	}

	return result{OK: true, Warnings: warnings, Install: plan}
}

func matched(ctx context.Context, st state.State, expr *cel.Expression) ([]string, error) {
	disks, err := blockhelpers.MatchDisks(ctx, st, expr)
	if err != nil {
		return nil, err
	}

	out := []string{}
	for _, d := range disks {
		out = append(out, d.TypedSpec().DevPath)
	}

	return out, nil
}

func planInstall(ctx context.Context, cfg config.Provider, st state.State) (*installPlan, error) {
	if unattendedSelector != nil {
		if expr := unattendedSelector(cfg); expr != nil {
			plan := &installPlan{Source: "UnattendedInstallConfig", Expression: expr.String()}

			var err error
			if plan.Matched, err = matched(ctx, st, expr); err != nil {
				return nil, err
			}

			if len(plan.Matched) > 0 {
				plan.Disk = plan.Matched[0]
			}

			return plan, nil
		}
	}

	raw := cfg.RawV1Alpha1()
	if raw == nil || raw.MachineConfig == nil || raw.MachineConfig.MachineInstall == nil { //nolint:staticcheck // the legacy install section
		return nil, nil
	}

	install := raw.MachineConfig.MachineInstall //nolint:staticcheck // the legacy install section
	plan := &installPlan{Source: "machine.install", Matched: []string{}}

	expr, err := install.DiskMatchExpression()
	if err != nil {
		return nil, err
	}

	if expr == nil {
		plan.Disk = install.Disk()

		return plan, nil
	}

	plan.Expression = expr.String()

	if plan.Matched, err = matched(ctx, st, expr); err != nil {
		return nil, err
	}

	if len(plan.Matched) > 0 {
		plan.Disk = plan.Matched[0]
	}

	return plan, nil
}
